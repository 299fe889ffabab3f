"""A file read from behind (a backlog) is cut into records that fill bulk_max_events: a read round
is sized to the room left in the record, so no record is split into a full body and a small one
(two requests where one would do)."""

from __future__ import annotations

from pathlib import Path

import orjson

from shipper.codec import decode_body
from shipper.ship import bulk as bulkproto
from tests.support.pipeline_rig import Rig


async def test_a_backlog_goes_in_full_records_without_small_split_bodies(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    n = 5_000
    with open(log, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"level": 30, "time": 1_764_000_000_000 + i, "msg": f"line {i}",
                                 "pad": "x" * (i % 97)}) + b"\n")
    rig = Rig(tmp_path, [str(log)], output_bulk_max_events=1000)
    p = rig.p
    try:
        await p.rescan()
        assert p.sources
        sizes: list[int] = []
        seen: set[int] = set()
        for _ in range(200):
            moved = p.read_round()
            if p.should_commit() or not moved:
                await p.commit()
            while len(p.outbox):
                meta, body = p.outbox.take()
                if body is None:
                    body = await rig.spool.read(meta.seq)
                assert body is not None
                pairs = bulkproto.split_pairs(decode_body(body, meta.gzipped))
                sizes.append(len(pairs))
                seen.update(orjson.loads(bulkproto.pair_parts(pr)[1])["time"] for pr in pairs)
                await rig.spool.ack(meta.seq)
                p.outbox.done()
                p.outbox.acked(meta, meta.events)
            if not moved and p.writer.draft.empty():
                break
        assert len(seen) == n and sum(sizes) == n
        assert max(sizes) <= 1000
        assert all(s >= 950 for s in sizes[:-1]), sizes      # full records; only the last one is what is left
        assert len(sizes) <= 6, sizes
    finally:
        p.close_files()
        await rig.spool.close()
