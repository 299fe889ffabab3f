"""Fixtures shared by the component tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pipeline_rig import Rig, RigFactory


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[RigFactory]:
    rigs: list[Rig] = []

    def make(paths: list[str] | None = None, **kw: Any) -> Rig:
        rig = Rig(tmp_path, paths or [str(tmp_path / "logs" / "*.log")], **kw)
        rigs.append(rig)
        return rig

    (tmp_path / "logs").mkdir()
    yield make
    for rig in rigs:
        await rig.close()
