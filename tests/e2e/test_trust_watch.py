"""The daemon's inotify watches within the trust boundary, end to end (SPEC, Trust boundaries;
issue 42): `nobody`, who may write the watched directory, makes a tree 300 levels deep and moves
in one of 10,000 sibling directories while an application writes its log beside them. The daemon
(root) holds at most its bound of watches (counted in /proc/<pid>/fdinfo: one `inotify wd:` line
per watch), says so once, keeps shipping the application's lines within the promptness bound,
ships a file 8 levels down and none deeper. Each line exactly once, each within the bound."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shipper.tail.watch import watch_limit
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.wait import wait_until
from tests.support.writer import Writer, write_lines

NOBODY = 65534
INDEX = "trustwatch"
PATTERN = INDEX + "*"
WIDE = 10_000
MAX_DEPTH = 8

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the daemon is root, the trees nobody's")


def as_nobody(script: str, cwd: Path) -> None:
    subprocess.run(["bash", "-ec", script], cwd=cwd, user=NOBODY, group=NOBODY, check=True, timeout=300)


def inotify_watches(pid: int) -> int:
    """The inotify watches process `pid` holds, over all its inotify fds (the kernel's count)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                n += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            pass                      # closed meanwhile
    return n


def nobodys(d: Path) -> Path:
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


def test_deep_and_wide_trees_cost_a_bounded_number_of_watches_and_no_line_waits(
        open_tmp: Path, es: ES, daemon_factory: Any) -> None:
    limit = watch_limit()              # this host's: min(8192, max_user_watches / 4)
    logs = nobodys(open_tmp / "logs")
    spare = nobodys(open_tmp / "spare")
    app = logs / "app.log"
    write_lines(app, range(0, 10))
    os.chown(app, NOBODY, NOBODY)
    cfg = write_config(open_tmp, es_url=es.url, paths=[f"{logs}/**/*.log"],
                       extra_yaml={"output": {"elasticsearch": {"index": INDEX}}})
    d: Daemon = daemon_factory(cfg).wait_ready()
    assert d.pid is not None
    wait_until(lambda: es.count(PATTERN) >= 10, lambda: d.tail(40), timeout_s=20)
    base = inotify_watches(d.pid)
    assert base <= 2, f"a tree of two directories holds {base} watches"
    with Writer(app, rate=200, start_seq=1000) as w:
        # the attacker's trees, made while the application writes: one deep, made a level at a
        # time in the watched directory; one wide, made aside and moved in at once
        deep = nobodys(logs / "deep")
        as_nobody("for i in $(seq 300); do mkdir l; cd l; done", deep)
        as_nobody(f"mkdir -p wide/d{{0..{WIDE - 1}}}", spare)
        os.rename(spare / "wide", logs / "wide")
        # a file below the deepest level a ** walk reaches (8 below the fixed part), then one at it:
        # the second shipped is a rescan that listed the deepest level after the first was there
        eight = deep.joinpath(*["l"] * (MAX_DEPTH - 1))
        write_lines(eight / "l" / "too-deep.log", range(6000, 6010))
        write_lines(eight / "ok.log", range(5000, 5010))
        wait_until(lambda: _said(d), lambda: f"the bound to be said\n{d.tail(40)}", timeout_s=30)
        wait_until(lambda: _shipped(es, range(5000, 5010)), lambda: f"ok.log\n{d.tail(40)}", timeout_s=30)
        written = w.stop()
    held = inotify_watches(d.pid)
    assert held <= limit, f"{held} watches held, the bound is {limit}"
    assert held >= MAX_DEPTH, held          # the deep tree's levels, and the wide tree up to the bound
    lines = _said(d)
    assert len(lines) == 1 and f"more than {limit} directories" in lines[0] and str(logs / "wide") in lines[0], lines
    # a later observable point: lines written after every rescan above are shipped, the deep file's not
    write_lines(app, range(9000, 9010))
    expected = list(range(0, 10)) + written + list(range(5000, 5010)) + list(range(9000, 9010))
    wait_until(lambda: es.count(PATTERN) >= len(expected), lambda: f"{len(expected)} docs\n{d.tail(40)}", timeout_s=30)
    es.assert_exactly_once(expected, index=PATTERN)
    assert d.alive and d.health() == 200


def _said(d: Daemon) -> list[str]:
    return [ln for ln in d.output().splitlines() if "a directory could not be watched" in ln]


def _shipped(es: ES, seqs: range) -> bool:
    have = {doc["_source"].get("seq") for doc in es.all_docs(PATTERN)}
    return all(s in have for s in seqs)
