"""A file read from behind (a backlog) is cut into records that fill bulk_max_events: a read round
is sized to the room left in the record, so no record is split into a full body and a small one
(two requests where one would do)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from shipper.codec import decode_body
from shipper.parse import document
from shipper.ship import bulk as bulkproto
from tests.support.native import c_function
from tests.support.pipeline_rig import Rig


async def test_a_backlog_goes_in_full_records_without_small_split_bodies(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    n = 5_000
    with open(log, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"level": 30, "time": 1_764_000_000_000 + i, "msg": f"line {i}",
                                 "pad": "x" * (i % 97)}) + b"\n")
    bodies = await _ship_all(tmp_path, log, "auto", 1000)
    sizes = [len(pairs) for pairs in bodies]
    seen = {orjson.loads(bulkproto.pair_parts(pr)[1])["time"] for pairs in bodies for pr in pairs}
    assert len(seen) == n and sum(sizes) == n
    assert max(sizes) <= 1000
    assert all(s >= 950 for s in sizes[:-1]), sizes      # full records; only the last one is what is left
    assert len(sizes) <= 6, sizes


async def _ship_all(tmp_path: Path, log: Path, fmt: str, max_events: int) -> list[list[bytes]]:
    """Read the file to its end through the pipeline, committing and acking as the daemon does:
    the pairs of each bulk body, in order."""
    rig = Rig(tmp_path, [str(log)], wall=1_790_000_000.0, output_bulk_max_events=max_events, input_format=fmt)
    p = rig.p
    bodies: list[list[bytes]] = []
    try:
        await p.rescan()
        for _ in range(200):
            moved = p.read_round()
            if p.should_commit() or not moved:
                await p.commit()
            while len(p.outbox):
                meta, body = p.outbox.take()
                if body is None:
                    body = await rig.spool.read(meta.seq)
                assert body is not None
                bodies.append(bulkproto.split_pairs(decode_body(body, meta.gzipped)))
                await rig.spool.ack(meta.seq)
                p.outbox.done()
                p.outbox.acked(meta, meta.events)
            if not moved and p.writer.draft.empty():
                break
    finally:
        p.close_files()
        await rig.spool.close()
    return bodies


@pytest.mark.parametrize("fmt", ["auto", "json"])
async def test_the_fused_loop_ships_what_split_then_build_ships(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 fmt: str) -> None:
    """The reader builds lines as it splits them (`_native.split_splice`, issue 14): the same pairs,
    in the same order, as with the loop off, for pino lines, text, broken JSON, duplicate keys,
    CRLF and a NUL hole; and it is the path the reader takes."""
    log = tmp_path / "app.log"
    with open(log, "wb") as f:
        for i in range(3_000):
            kind = i % 7
            if kind == 3:
                f.write(b"plain text %d\n" % i)
            elif kind == 4:
                f.write(b'{"a":1,"a":2,"time":%d}\r\n' % (1_764_000_000_000 + i))
            elif kind == 5:
                f.write(b'{"broken": %d\n' % i)
            else:
                f.write(orjson.dumps({"level": 30, "time": 1_764_000_000_000 + i, "msg": f"line {i}",
                                     "pad": "x" * (i % 97)}) + b"\n")
        f.write(b"\x00" * 64 + b'{"time":1764000009999,"msg":"after a hole"}\n')
    calls = 0
    fused = c_function("split_splice")

    def counting(*args: object) -> object:
        nonlocal calls
        calls += 1
        return fused(*args)

    monkeypatch.setattr(document, "native_split_splice", counting)
    with_loop = [pr for pairs in await _ship_all(tmp_path / "a", log, fmt, 700) for pr in pairs]
    assert calls > 0
    monkeypatch.setattr(document, "native_split_splice", None)
    without = [pr for pairs in await _ship_all(tmp_path / "b", log, fmt, 700) for pr in pairs]
    assert len(with_loop) == 3_001
    assert _anon(with_loop) == _anon(without)


def _anon(pairs: list[bytes]) -> list[bytes]:
    """The pairs without the incarnation in their _id (each state dir draws its own)."""
    return [re.sub(rb'"_id":"[0-9a-f]+-', b'"_id":"INC-', p) for p in pairs]
