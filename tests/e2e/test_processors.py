"""The processors on a real daemon (SPEC: "Dropping, sampling, throttling, redacting"): pino-http
lines in a real file, `shipper run` as a subprocess, osmem as Elasticsearch. The right events are
dropped (each kept line exactly once and promptly, none of the dropped ones), counted by reason in
`shipper_events_dropped_total` and `shipper status`, and checkpointed past (status lag 0); `sample`
keeps the same lines across a kill -9; `throttle` is per key; `redact` reaches nested and dotted
keys and the ECS copies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shipper.parse.processors import REDACTED, sample_point
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.wait import wait_until
from tests.support.writer import line_offsets, pino_line, write_lines

pytestmark = pytest.mark.slow

INDEX = "proc"
KEEP = 0.3


def line(seq: int) -> bytes:
    """A pino-http line of one of four kinds: a health check, a static asset, an API request of
    service a or b (with secrets in its headers, one of them as a key with dots), or a debug line."""
    kind = seq % 5
    if kind == 0:
        return pino_line(seq, req={"method": "GET", "url": "/healthz", "headers": {"user-agent": "kube-probe/1.30"}},
                         name="checkout")
    if kind == 1:
        return pino_line(seq, req={"method": "GET", "url": f"/static/app.{seq}.js?v=3"}, name="checkout")
    if kind == 4:
        return pino_line(seq, level=20, msg="cache detail", name="checkout")
    svc = "a" if seq % 10 < 5 else "b"
    return pino_line(seq, name=svc, req={"method": "POST", "url": f"/api/pay?token=s3cr3t-{seq}",
                                         "headers": {"authorization": f"Bearer tok-{seq}", "host": "h"}},
                     **{"req.headers.cookie": f"sid={seq}"}, password=f"pw{seq}", user={"password": "x", "id": seq})


def config(tmp_path: Path, es_url: str, log: Path, **input_extra: Any) -> Path:
    return write_config(tmp_path, es_url=es_url, paths=[log], input_extra={
        "drop_when": [{"field": "url.path", "equals": "/healthz"}, {"field": "log.level", "in": ["trace", "debug"]}],
        "sample": [{"field": "url.path", "prefix": "/static/", "keep": KEEP}],
        "throttle": {"key": "{service.name}", "events_per_s": 0.001, "burst": 7},
        "redact": ["req.headers.authorization", "req.headers.cookie", "req.url", "*.password", "password"],
        "exclude_lines": ['"seq":13,'],
        **input_extra}, extra_yaml={"output": {"elasticsearch": {"index": INDEX}}})


def expected(path: Path, incarnation: str) -> tuple[list[int], dict[str, int]]:
    """The seqs that must arrive and the drops by reason, from SPEC's rules (in their order:
    exclude_lines on the line, then drop_when, sample by `_id`, throttle per service)."""
    keep: list[int] = []
    dropped = {"drop_when": 0, "sample": 0, "throttle": 0, "exclude_lines": 0}
    tokens = {"a": 7, "b": 7, "checkout": 7}        # burst 7, refill 0.001/s: none within the test
    for seq, off in sorted(line_offsets(path).items(), key=lambda kv: kv[1]):
        kind = seq % 5
        if seq == 13:
            dropped["exclude_lines"] += 1
        elif kind in (0, 4):
            dropped["drop_when"] += 1
        elif kind == 1 and sample_point(f"{incarnation}-{off}".encode()) >= int(KEEP * 2**64):
            dropped["sample"] += 1
        else:
            svc = "checkout" if kind == 1 else "a" if seq % 10 < 5 else "b"
            if tokens[svc] >= 1:
                tokens[svc] -= 1
                keep.append(seq)
            else:
                dropped["throttle"] += 1
    return keep, dropped


def drained(d: Daemon, log: Path) -> bool:
    files = d.status_json()["files"]
    return bool(files) and files[0]["offset"] == log.stat().st_size and files[0]["lag_bytes"] == 0


def test_the_processors_drop_count_checkpoint_and_redact(tmp_path: Path, es: ES, osmem_clone: Any,
                                                         daemon_factory: Any) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    write_lines(log, range(0, 60), line_fn=line)
    d = daemon_factory(config(tmp_path, osmem_clone.url, log))
    d.wait_ready()
    wait_until(lambda: drained(d, log), lambda: f"every line checkpointed: {d.status_json()['files']}")
    write_lines(log, range(60, 120), line_fn=line)          # more while it runs
    wait_until(lambda: drained(d, log), lambda: f"every line checkpointed: {d.status_json()['files']}")
    incarnation = d.status_json()["files"][0]["incarnation"]
    keep, dropped = expected(log, incarnation)
    assert dropped["sample"] > 0 and dropped["throttle"] > 0 and len(keep) > 14
    docs = es.assert_exactly_once(keep, index=INDEX)
    for hit in docs:
        src = hit["_source"]
        assert src["req"]["url"] == REDACTED and "url" not in src     # req.url and its ECS copies
        if src["name"] in ("a", "b"):                      # the API lines: every secret redacted
            assert src["req"]["headers"] == {"authorization": REDACTED, "host": "h"}
            assert src["req.headers.cookie"] == REDACTED and src["password"] == REDACTED
            assert src["user"] == {"password": REDACTED, "id": src["seq"]}
            assert b"s3cr3t" not in json.dumps(src).encode() and src["service"] == {"name": src["name"]}
        else:
            assert src["seq"] % 5 == 1 and src["http"]["request"]["method"] == "GET"      # a static asset
    want = {r: n for r, n in dropped.items()}
    label = str(log)
    for reason, n in want.items():
        assert d.metric("shipper_events_dropped_total", input=label, reason=reason) == n, reason
    status = d.status_json()
    (row,) = status["inputs"]
    assert row == {"input": label, "dropped": want, "dropped_total": sum(want.values())}
    text = d.cli("status", check=True).stdout
    assert f"dropped: {sum(want.values()):,} events of {label} (drop_when {want['drop_when']:,}" in text
    assert status["files"][0]["lag_bytes"] == 0
    assert d.terminate() == 0


def test_sample_keeps_the_same_lines_across_kill_9(tmp_path: Path, es: ES, osmem_clone: Any,
                                                   daemon_factory: Any) -> None:
    """Only static-asset lines, sampled at 30 %; the daemon is killed while it reads them and
    started again: the lines kept are exactly those whose `_id` sampling keeps, each once, though
    some were read twice."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"

    def static(seq: int) -> bytes:
        return pino_line(seq, req={"method": "GET", "url": f"/static/{seq}.css"}, name="web")

    write_lines(log, range(0, 6000), line_fn=static)
    cfg = config(tmp_path, osmem_clone.url, log, throttle=None, drop_when=[], exclude_lines=[])
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: es.count(INDEX + "*") >= 100, "some sampled lines arrived", timeout_s=30)
    d.kill9()
    write_lines(log, range(6000, 8000), line_fn=static)
    d.restart()
    wait_until(lambda: drained(d, log), lambda: f"every line checkpointed: {d.status_json()['files']}", timeout_s=60)
    incarnation = d.status_json()["files"][0]["incarnation"]
    offs = line_offsets(log)
    keep = [s for s, off in offs.items() if sample_point(f"{incarnation}-{off}".encode()) < int(KEEP * 2**64)]
    assert 0.25 * len(offs) < len(keep) < 0.35 * len(offs)
    es.assert_exactly_once(keep, index=INDEX)
    assert d.terminate() == 0
