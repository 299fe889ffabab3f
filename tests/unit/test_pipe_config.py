"""`shipper pipe`'s configuration: stdin cannot be read twice, so its events are always queued on
disk before they are sent (SPEC, Delivery), whatever queue.spool the config file says."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shipper.commands.pipe import build_config


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"config": None, "url": "http://127.0.0.1:9200", "index": "logs", "state_dir": None, "format": None,
            "timeout": "30s"}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("spool", [None, "when_behind", "always"])
def test_pipe_queues_everything_on_disk(tmp_path: Path, spool: str | None) -> None:
    args = _args(state_dir=str(tmp_path / "state"))
    if spool is not None:
        cfg_file = tmp_path / "shipper.yaml"
        cfg_file.write_text(f"state_dir: {tmp_path / 'state'}\nqueue: {{spool: {spool}}}\n"
                            "output: {elasticsearch: {hosts: ['http://127.0.0.1:9200']}}\n")
        args = _args(config=str(cfg_file))
    cfg, _inp, _timeout = build_config(args, {})
    assert cfg.queue.spool == "always"
