"""copytruncate twice in quick succession, step by step on real files: shipper sees the first
truncation and finds the copy holding the rest of what it read (app.log.1) by content, but by the
time it opens that name the next rotation has renamed the copy to app.log.2 and put its own copy
at app.log.1. The rest is somewhere still: it must be read from wherever it went, not given up
(a fresh-clone CI run of test_rotation's test_copytruncate lost the 150 lines after the first
truncation: 550 of 700)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shipper.tail import opening
from tests.support.pipeline_rig import Rig
from tests.support.rotate import rotate_copytruncate


def _lines(first: int, n: int) -> bytes:
    return b"".join(f"line {i} {'x' * 200}\n".encode() for i in range(first, first + n))


@pytest.mark.parametrize("moves", [1, 3])
def test_a_copy_that_moves_while_it_is_opened_is_read_from_where_it_went(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moves: int) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    app.write_bytes(_lines(0, 50))
    real_open = opening.open_log
    rotations: list[int] = []

    def racing(path: str, rule: Any) -> Any:
        # the next rotation lands between the look by content and the open (once, or at every look)
        if path.endswith("app.log.1") and len(rotations) < moves:
            rotations.append(1)
            with open(app, "ab") as f:
                f.write(_lines(1000 * len(rotations), 10))
            rotate_copytruncate(app)
        return real_open(path, rule)

    async def scenario() -> Rig:
        rig = Rig(tmp_path, [str(app)])
        await rig.step()
        assert len(rig.docs) == 50
        with open(app, "ab") as f:
            f.write(_lines(50, 150))          # not read yet when the rotation comes
        rotate_copytruncate(app)
        with open(app, "ab") as f:
            f.write(_lines(200, 20))
        monkeypatch.setattr(opening, "open_log", racing)
        await rig.step()
        monkeypatch.setattr(opening, "open_log", real_open)
        await rig.settle(steps=4)
        return rig

    loop = asyncio.new_event_loop()
    try:
        rig = loop.run_until_complete(scenario())
        try:
            assert rotations, "the race was not reached: the copy was never opened by its name"
            expected = [f"line {i} {'x' * 200}" for i in range(220)]
            expected += [f"line {i} {'x' * 200}" for r in range(1, len(rotations) + 1)
                         for i in range(1000 * r, 1000 * r + 10)]
            msgs = rig.messages()
            missing = sorted(set(expected) - set(msgs), key=expected.index)
            assert not missing, f"{len(missing)} lines never shipped, e.g. {[m[:12] for m in missing[:3]]}"
            assert len(msgs) == len(set(msgs)) == len(expected), \
                f"{len(msgs) - len(set(msgs))} lines twice, {len(set(msgs) - set(expected))} unexpected"
        finally:
            loop.run_until_complete(rig.close())
    finally:
        loop.close()
