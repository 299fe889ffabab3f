"""Container logs through the real reading side (`sources/file_reading.py`), in-process under the
fake clock on real files: a record held across reads and restarts, format auto's per-file
recognition, multiline per stream after the join, a partial record at the end of a file that
will not grow, and the symlink helpers rotation recovery leans on (siblings beside the target,
copies there known as the link's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from shipper.config import MultilineConfig
from shipper.model import Checkpoint
from shipper.parse.container_join import ContainerJoiner
from shipper.tail import identity, look
from shipper.tail.catalog import Catalog
from tests.support.container_writer import RuntimeLog, cri_pieces, docker_pieces, interleave, ticks
from tests.support.kubelet import PodLog, kubelet_rotate
from tests.support.pipeline_rig import Rig, RigFactory

CID = "ab" * 32


def pino(seq: int, pad: int = 0, **kw: Any) -> bytes:
    d: dict[str, Any] = {"level": 30, "time": 1_796_119_200_000 + seq, "seq": seq, "msg": f"m{seq}", **kw}
    if pad:
        d["pad"] = "y" * pad
    return orjson.dumps(d)


def seqs(rig: Rig) -> list[int]:
    return sorted(d["seq"] for d in rig.docs.values() if "seq" in d)


def by_seq(rig: Rig) -> dict[int, dict[str, Any]]:
    return {d["seq"]: d for d in rig.docs.values() if "seq" in d}


async def test_a_record_held_at_the_end_is_checkpointed_at_its_first_piece(make_rig: RigFactory,
                                                                          tmp_path: Path) -> None:
    """Two of three docker pieces read: no document, the checkpoint at the first piece; a restart
    re-reads it whole; the stderr line between the pieces is shipped once, with the same _id."""
    log = tmp_path / "logs" / "app.log"
    clock = ticks()
    head = [r for s in range(3) for r in docker_pieces(pino(s), "stdout", next(clock))]
    big = docker_pieces(pino(3, 40_000), "stdout", next(clock))
    err = docker_pieces(pino(4, level=50), "stderr", next(clock))
    w = RuntimeLog(log)
    w.write_records(head + interleave(big[:2], err, [0, 1, 0]))
    rig = make_rig(input_format="docker")
    await rig.step()
    assert seqs(rig) == [0, 1, 2, 4]
    (f,) = rig.p.sources.values()
    assert isinstance(f.holder, ContainerJoiner)
    first = sum(map(len, head))
    assert f.checkpoint.offset == first and f.holds_lines()
    ids = set(rig.docs)
    await rig.restart()
    w.write_records(big[2:])
    await rig.step()
    assert seqs(rig) == [0, 1, 2, 3, 4] and set(rig.docs) - ids == {next(i for i in rig.docs if i.endswith(f"-{first}"))}
    assert rig.dup_ids and all(i in ids for i in rig.dup_ids)      # the stderr line again: the same _id (a 409)
    d = by_seq(rig)[3]
    assert len(d["pad"]) == 40_000 and d["log"]["offset"] == first and d["log"]["stream"] == "stdout"
    (f,) = rig.p.sources.values()
    assert f.checkpoint.offset == log.stat().st_size and not f.holds_lines()


async def test_format_auto_takes_a_container_file_as_one_and_a_plain_file_as_before(make_rig: RigFactory,
                                                                                   tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    clock = ticks()
    RuntimeLog(logs / "cri.log").write_records(
        [r for s in range(5) for r in cri_pieces(pino(s, 20_000 if s == 2 else 0), "stderr", next(clock))])
    (logs / "plain.log").write_bytes(b"".join(pino(s) + b"\n" for s in range(100, 105)))
    rig = make_rig()
    await rig.step()
    assert seqs(rig) == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]
    docs = by_seq(rig)
    assert all(docs[s]["log"]["stream"] == "stderr" for s in range(5)) and len(docs[2]["pad"]) == 20_000
    assert all("stream" not in docs[s]["log"] for s in range(100, 105))
    holders = {os.path.basename(f.checkpoint.path): f.holder for f in rig.p.sources.values()}
    assert isinstance(holders["cri.log"], ContainerJoiner) and holders["plain.log"] is None


async def test_multiline_per_stream_after_the_join_with_its_timeout(make_rig: RigFactory, tmp_path: Path) -> None:
    """A Java trace on stderr interleaved with stdout lines: one event per stream; the last one
    goes when its timeout passes on the fake clock."""
    log = tmp_path / "logs" / "app.log"
    clock = ticks()
    err = [b"2026-12-01 10:00:00 ERROR boom", b"java.lang.IllegalStateException: x", b"\tat a.B.c(B.java:1)",
           b"2026-12-01 10:00:01 INFO recovered"]
    out = [b"2026-12-01 10:00:00 INFO one", b"2026-12-01 10:00:00 INFO two"]
    recs = interleave([r for ln in err for r in cri_pieces(ln, "stderr", next(clock))],
                      [r for ln in out for r in cri_pieces(ln, "stdout", next(clock))], [0, 1, 0, 1, 0])
    RuntimeLog(log).write_records(recs)
    rig = make_rig(input_format="cri", input_multiline=MultilineConfig(start=r"^\d{4}-", timeout_s=1.0))
    await rig.step()
    msgs = sorted(rig.messages())
    assert "2026-12-01 10:00:00 ERROR boom\njava.lang.IllegalStateException: x\n\tat a.B.c(B.java:1)" in msgs
    assert "2026-12-01 10:00:01 INFO recovered" not in msgs           # held: the next start may never come
    await rig.step(advance_s=2.0)
    assert rig.count("2026-12-01 10:00:01 INFO recovered") == 1
    streams = {d["message"].split("\n")[0]: d["log"]["stream"] for d in rig.docs.values()}
    assert streams["2026-12-01 10:00:00 ERROR boom"] == "stderr" and streams["2026-12-01 10:00:00 INFO one"] == "stdout"


async def test_a_partial_record_in_a_deleted_file_is_shipped_as_it_is(make_rig: RigFactory, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "app.log"
    clock = ticks()
    w = RuntimeLog(log)
    w.write_records(cri_pieces(pino(0), "stdout", next(clock)))
    w.write_records(cri_pieces(pino(1), "stdout", next(clock), terminated=False))      # a P, never its F
    rig = make_rig(input_format="cri")
    await rig.step()
    assert seqs(rig) == [0]
    w.close()
    log.unlink()
    await rig.settle()
    assert seqs(rig) == [0, 1] and not rig.p.sources


async def test_the_splitter_lets_a_docker_piece_through_and_the_record_is_capped(make_rig: RigFactory,
                                                                                 tmp_path: Path) -> None:
    """max_line_bytes 20000: a piece of 16 KiB of `<` (6x once escaped) passes the splitter whole;
    the joined 40 KiB line is cut at 20000 and flagged."""
    log = tmp_path / "logs" / "app.log"
    RuntimeLog(log).write_records(docker_pieces(b"<" * 40_000, "stdout", 1_796_119_200_000_000_000)
                                  + docker_pieces(pino(1), "stdout", 1_796_119_200_000_000_001))
    rig = make_rig(input_format="docker", input_max_line_bytes=20_000)
    await rig.step()
    (cut,) = [d for d in rig.docs.values() if "seq" not in d]
    assert cut["message"] == "<" * 20_000 and cut["log"]["flags"] == ["truncated"]
    assert seqs(rig) == [1]


# ---------------------------------------------------------------- symlinks: the pure-ish helpers

def test_the_rotated_siblings_of_a_link_are_its_targets(tmp_path: Path) -> None:
    p = PodLog(tmp_path, "ns", "pod", "1234abcd-0000", "c", CID)
    p.create()
    p.target.write_bytes(b"x\n")
    rotated = kubelet_rotate(p.target, 1_796_119_200.0, p.target.touch)
    assert look.Surroundings().rotated(str(p.link)) == [str(rotated)]
    os.unlink(p.target)                          # between the rename and the reopen: the link dangles
    assert look.Surroundings().rotated(str(p.link)) == [str(rotated)]


def test_a_copy_beside_a_links_target_is_a_copy_of_the_links_incarnation() -> None:
    link = "/var/log/containers/pod_ns_c-" + CID + ".log"
    target = "/var/log/pods/ns_pod_uid/c/0.log"
    head = b"2026-12-01T10:00:00.000000001Z stdout F " + b"z" * 2000
    fp_len, fp = identity.FP_MAX_BYTES, identity.digest(head[:identity.FP_MAX_BYTES])
    cp = Checkpoint("inc1", link, 1, 10, fp_len, fp, 5, 100, 0.0)
    cat = Catalog([cp])
    assert cat.copy_of(target + ".20261201-100000.gz", head, (1, 99)) is None
    cat.note_links({identity.rotation_root(target): link})
    found = cat.copy_of(target + ".20261201-100000.gz", head, (1, 99))
    assert found is not None and found.incarnation == "inc1"


async def test_an_idle_file_with_a_partial_record_is_parked_and_joined_when_it_grows(make_rig: RigFactory,
                                                                                   tmp_path: Path) -> None:
    """close_inactive passes while a record waits for its last piece (a renamed file nobody
    writes to again would otherwise hold its fd for good): closed, and reopened when it grows,
    the record is read again from its first piece and comes out whole, once."""
    log = tmp_path / "logs" / "app.log"
    clock = ticks()
    big = docker_pieces(pino(1, 20_000), "stdout", next(clock))
    w = RuntimeLog(log)
    w.write_records(docker_pieces(pino(0), "stdout", next(clock)) + big[:1])
    rig = make_rig(input_format="docker", input_close_inactive_s=1.0)
    await rig.step()
    await rig.settle()
    assert seqs(rig) == [0] and not rig.p.sources and rig.p.files.files.parked
    w.write_records(big[1:])
    await rig.settle()
    assert seqs(rig) == [0, 1] and not rig.dup_ids and len(by_seq(rig)[1]["pad"]) == 20_000
