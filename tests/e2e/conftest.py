"""The e2e tests' own fixtures: every test runs on a promptness timeline, and its osmem clone is
reached through a RecordingProxy, so the oracle knows when each document arrived
(tests/support/promptness.py). `osmem_clone.url` and `es.url` are the proxy's: a daemon pointed at
either, or at a FaultProxy in front of it, is seen."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import promptness
from tests.support.es import ES
from tests.support.promptness import Timeline
from tests.support.proxy import RecordingProxy


@pytest.fixture(autouse=True)
def timeline() -> Iterator[Timeline]:
    with promptness.active(Timeline()) as tl:
        yield tl


@dataclass
class RecordedClone:
    """An osmem clone behind a RecordingProxy: `url` is the proxy's, `direct_url` the clone's."""

    clone: Any
    url: str

    @property
    def direct_url(self) -> str:
        return str(self.clone.url)

    @property
    def id(self) -> str:
        return str(self.clone.id)


@pytest.fixture
def osmem_clone(osmem_server: Any, timeline: Timeline) -> Iterator[RecordedClone]:
    clone = osmem_server.clone()
    try:
        with RecordingProxy(clone.url, timeline) as rec:
            yield RecordedClone(clone, rec.url)
    finally:
        clone.close()


@pytest.fixture
def es(osmem_clone: RecordedClone, timeline: Timeline) -> ES:
    """The oracle's client, through the recorder; its assert_exactly_once checks promptness too."""
    return ES(osmem_clone.url, timeline=timeline)
