"""`shipper status` with the daemon stopped: what the state dir says, file by file, against the files now."""

from __future__ import annotations

import os
import time
from pathlib import Path

from shipper.commands.status import collect
from shipper.config import load_config_text
from shipper.model import Checkpoint
from shipper.spool import Spool


def test_an_incarnation_finished_by_copytruncate_shows_no_lag_against_the_file_that_followed(tmp_path: Path) -> None:
    """Found trying main as a user: four copytruncate rotations, everything shipped, the daemon
    stopped: `shipper status` showed each finished incarnation at 60% with 244 KiB of lag (its end
    against the size of the file now at its inode, which belongs to the incarnation after it) and
    'backlog: 985.6 KiB not yet shipped'. A finished incarnation was read to its end: nothing of it
    is left to ship once its records are acknowledged."""
    log = tmp_path / "app.log"
    log.write_bytes(b"x" * 611 + b"\n")                # the file after copytruncate, grown again
    st = os.stat(log)
    state = tmp_path / "state"
    state.mkdir()
    now = time.time()
    old = Checkpoint("old1", str(log), st.st_dev, st.st_ino, 16, "fp-old", 370, 370, now - 20, finished=True)
    live = Checkpoint("new1", str(log), st.st_dev, st.st_ino, 16, "fp-new", 612, 612, now - 1)
    s = Spool(str(state))
    try:
        s.save_checkpoints([old, live])
    finally:
        s.close()
    cfg = load_config_text(f"state_dir: {state}\ninputs: [{{paths: ['{tmp_path}/*.log']}}]\n"
                           "output: {elasticsearch: {hosts: ['http://127.0.0.1:9']}}\nmetrics: {listen: null}\n")
    out = collect(cfg, now)
    assert out["daemon"] == "stopped"
    by_inc = {f["incarnation"]: f for f in out["files"]}
    assert by_inc["new1"]["lag_bytes"] == 0
    assert "old1" not in by_inc or by_inc["old1"]["lag_bytes"] == 0, by_inc["old1"]
    assert out["lag_bytes"] == 0
