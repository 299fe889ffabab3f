"""tests/support/kubelet.py does what the kubelet's container log manager does to a log: the newest
rotated piece stays plain, older ones are gzipped (through .tmp), the oldest beyond max_files go,
and the runtime's reopen creates the new file; no line is lost in between."""

from __future__ import annotations

import gzip
from pathlib import Path

from tests.support.container_writer import RuntimeLog, cri_record
from tests.support.kubelet import PodLog, kubelet_rotate, rotated_name

T0 = 1_796_119_200


def test_three_rotations_keep_every_line_in_order(tmp_path: Path) -> None:
    p = PodLog(tmp_path, "shop", "web-1", "uid-0000-1111", "api", "ab" * 32)
    p.create()
    assert p.link.is_symlink() and p.link.resolve() == p.target
    runtime = RuntimeLog(p.target)
    written = []
    for r in range(3):
        for i in range(5):
            rec = cri_record(b"line %d.%d" % (r, i), "stdout", "F", T0 * 10**9)
            runtime.write_records([rec])
            written.append(rec)
        (p.target.parent / "stale.log.tmp").write_bytes(b"")      # ignored: not a piece of 0.log
        kubelet_rotate(p.target, T0 + 60 * r, runtime.reopen)
    runtime.write_records([cri_record(b"live", "stdout", "F", T0 * 10**9)])
    runtime.close()
    names = sorted(x.name for x in p.target.parent.iterdir())
    r0, r1, r2 = (rotated_name(p.target, T0 + 60 * r).name for r in range(3))
    assert names == sorted(["0.log", r0 + ".gz", r1 + ".gz", r2, "stale.log.tmp"])
    content = (gzip.decompress((p.target.parent / (r0 + ".gz")).read_bytes())
               + gzip.decompress((p.target.parent / (r1 + ".gz")).read_bytes())
               + (p.target.parent / r2).read_bytes() + p.target.read_bytes())
    assert content == b"".join(written) + cri_record(b"live", "stdout", "F", T0 * 10**9)


def test_excess_pieces_and_leftovers_are_removed(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    runtime = RuntimeLog(log)
    for r in range(4):
        runtime.write_records([b"r%d\n" % r])
        kubelet_rotate(log, T0 + r, runtime.reopen, max_files=3)      # max_files counts the live file too
    (tmp_path / (rotated_name(log, T0 + 3).name + ".gz.tmp")).write_bytes(b"half")
    kubelet_rotate(log, T0 + 9, runtime.reopen, max_files=3)
    runtime.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["0.log", rotated_name(log, T0 + 3).name + ".gz",
                                                          rotated_name(log, T0 + 9).name]
