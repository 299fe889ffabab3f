"""kill -9 around a logrotate `compress` rotation, step by step on real files: the reading side of a
real pipeline (tests/support/pipeline_rig.py) dropped where it stands, the rotation done as
logrotate does it, a new pipeline on the same spool; every line shipped exactly once.

The file in both: logrotate created app.log empty and shipper opened it before the app wrote, so
its incarnation's start was stored with an empty file's fingerprint, which names nothing. The app
writes, shipper ships and is acked, but the checkpoint the acks moved is not written yet (the
keeper writes them at most once a second, after 10 s at a trickle). kill -9; logrotate compress
runs; restart. The .gz holds what was shipped: it must be known as that incarnation's copy by its
first bytes, not shipped again as a file no one saw (every line twice, as in test_rotation's
kill -9 test)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.support.pipeline_rig import Rig
from tests.support.rotate import rotate

N = 300


def _lines(first: int, n: int) -> bytes:
    return b"".join(f"line {i} {'x' * 200}\n".encode() for i in range(first, first + n))


def _shipped_once_after_kill_and_compress(tmp_path: Path, ship: Callable[[Rig, Path], Awaitable[None]]) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    app.write_bytes(b"")

    async def scenario() -> Rig:
        rig = Rig(tmp_path, [str(app)])
        rig.flush_acked = False                  # the keeper's timer has not written what acks moved
        await rig.step()                         # opened empty: its start stored with it
        with open(app, "ab") as f:
            f.write(_lines(0, N))
        await ship(rig, app)
        assert len(rig.docs) == N
        await rig.kill()
        rotate(app, mode="create", compress=True, keep=5)
        rig.flush_acked = True
        await rig.settle(steps=3)
        return rig

    loop = asyncio.new_event_loop()
    try:
        rig = loop.run_until_complete(scenario())
        try:
            msgs = rig.messages()
            assert len(msgs) == N and len(set(msgs)) == N, \
                f"{len(msgs) - len(set(msgs))} lines shipped twice, {N - len(set(msgs))} never"
        finally:
            loop.run_until_complete(rig.close())
    finally:
        loop.close()


def test_a_file_opened_empty_is_known_in_its_gz_after_a_kill(tmp_path: Path) -> None:
    async def ship(rig: Rig, app: Path) -> None:
        await rig.step()

    _shipped_once_after_kill_and_compress(tmp_path, ship)


def test_a_checkpoint_planned_before_the_first_bytes_does_not_unname_it(tmp_path: Path) -> None:
    """The keeper's timer writes what the window planned while the first draft of lines is out:
    the checkpoint of the draft before (opened, empty, no fingerprint), written after the record
    that stored the fingerprint. It must not take the fingerprint back."""
    async def ship(rig: Rig, app: Path) -> None:
        p = rig.p
        await p.rescan()
        await p.open_waiting()
        assert p.read_round()
        await p.check_sources()
        await p.commit()                          # out from memory, its start stored before it
        await rig.flush_checkpoints()             # the timer, while it is in flight
        await rig.collect()                       # the ack

    _shipped_once_after_kill_and_compress(tmp_path, ship)
