"""FileSet's indexes of its open files: `awake` (not quiet) and `holding` (with a holder).

Read rounds and checks that pass quiet files by walk `awake` instead of every open file, and the
deadline looks walk `holding`, so an index that drifted from `open` would skip a file that has
something to read (a lost wake-up) or a multiline timeout. Hypothesis drives random sequences of
opens, closes, replacements, quiet flips and holder changes against the plain definition.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.tail.fileset import FileSet, Key, OpenFile
from shipper.tail.harvester import Harvester
from tests.support.fake_clock import RecordingEvents


class _Harvester:
    """What FileSet touches of a harvester: its path and close()."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _file(n: int) -> OpenFile:
    return OpenFile(cast(Harvester, _Harvester(f"/logs/{n}.log")), 0)


def _holds(fs: FileSet) -> None:
    assert fs.awake == {k: f for k, f in fs.open.items() if not f.quiet}
    assert fs.holding == {k: f for k, f in fs.open.items() if f.holder is not None}


ops = st.lists(st.tuples(st.sampled_from(["add", "close", "quiet", "wake", "hold", "unhold", "close_all",
                                          "stale_quiet"]),
                         st.integers(0, 2)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_indexes_are_the_open_files_not_quiet_and_those_holding(seq: list[tuple[str, int]]) -> None:
    fs = FileSet(10, RecordingEvents())
    gone: list[OpenFile] = []          # files closed or replaced: their setters must not touch fs
    for op, i in seq:
        key: Key = (1, i)
        f = fs.open.get(key)
        if op == "add":
            if f is not None:
                gone.append(f)        # replaced under the same key (a reopen)
            fs.add(key, _file(i))
        elif op == "close" and f is not None:
            fs.close(key)
            gone.append(f)
        elif op == "quiet" and f is not None:
            f.quiet = True
        elif op == "wake" and f is not None:
            f.quiet = False
        elif op == "hold" and f is not None:
            f.holder = cast(Any, object())
        elif op == "unhold" and f is not None:
            f.holder = None
        elif op == "close_all":
            gone.extend(fs.open.values())
            fs.close_all()
        elif op == "stale_quiet" and gone:
            old = gone[i % len(gone)]
            old.quiet = not old.quiet          # a closed file's flag moves: no index follows it
            old.holder = None if old.holder is not None else cast(Any, object())
        _holds(fs)


def test_a_file_opened_quiet_or_holding_is_indexed_as_it_is() -> None:
    fs = FileSet(10, RecordingEvents())
    f = _file(1)
    f.quiet = True                              # not in a set yet: nothing to keep
    f.holder = cast(Any, object())
    fs.add((1, 1), f)
    assert fs.awake == {} and fs.holding == {(1, 1): f}
    f.quiet = False
    assert fs.awake == {(1, 1): f}
