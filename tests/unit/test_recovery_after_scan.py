"""Recovery.after_scan: which known paths to look around after a rescan.

It runs after every rescan over every known path, so it is written with set operations; this
checks it against the plain definition, a loop over the known paths (what it was before), on
random sequences of rescans and of paths becoming known, and that a new incarnation's look
among the siblings starts from the rescan before the one that lost sight of the path.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.model import Checkpoint
from shipper.tail.catalog import Catalog
from shipper.tail.fileset import FileSet
from shipper.tail.recovery import Recovery
from tests.support.fake_clock import RecordingEvents

PATHS = [f"/logs/{n}.log" for n in range(6)]


def _cp(n: int, path: str, updated: float = 1.0) -> Checkpoint:
    return Checkpoint(incarnation=f"inc{n}", path=path, dev=1, inode=n, fp_len=0, fp="", offset=0,
                      updated=updated)


def _recovery(catalog: Catalog) -> Recovery:
    return Recovery(catalog, FileSet(10, RecordingEvents()), RecordingEvents(), lambda cp: None, lambda p: 0)


def _reference(known: list[str], vanished: set[str], seen: set[str], first: bool) -> list[str]:
    out = []
    for path in known:
        if first:
            out.append(path)
        if path in seen:
            vanished.discard(path)
        elif path not in vanished:
            vanished.add(path)
            if not first:
                out.append(path)
    return out


steps = st.lists(st.tuples(st.frozensets(st.sampled_from(PATHS)),          # what the rescan saw
                           st.lists(st.sampled_from(PATHS), max_size=2)),  # paths read at since
                 min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PATHS), max_size=4), steps)
def test_the_paths_to_look_around_are_the_loops(start: list[str], seq: list[tuple[frozenset[str], list[str]]]) -> None:
    catalog = Catalog(_cp(i, p) for i, p in enumerate(start))
    rec = _recovery(catalog)
    vanished: set[str] = set()
    n = len(start)
    for i, (seen, read_at) in enumerate(seq):
        first = i == 0
        expected = _reference(catalog.paths(), vanished, set(seen), first)
        got = rec.after_scan(float(i), set(seen), first)
        assert sorted(got) == sorted(expected)
        assert len(got) == len(set(got))
        assert rec.vanished == vanished
        for p in read_at:
            catalog.index(_cp(n, p))
            n += 1


def test_a_lost_path_is_looked_at_from_the_rescan_before() -> None:
    catalog = Catalog([_cp(0, "/logs/a.log", updated=5.0)])
    rec = _recovery(catalog)
    assert rec.after_scan(100.0, {"/logs/a.log"}, True) == ["/logs/a.log"]
    assert rec.after_scan(110.0, {"/logs/a.log"}, False) == []
    assert rec.after_scan(120.0, set(), False) == ["/logs/a.log"]       # found empty: once
    assert rec.after_scan(130.0, set(), False) == []
    assert rec.after_scan(140.0, {"/logs/a.log"}, False) == []
    rec.lost_sight_of("/logs/a.log", 0)
    # the rescan before the latest saw nothing there: from the checkpoint's own time
    assert rec._successor_paths["/logs/a.log"] == (5.0, 0)
    rec._successor_paths.clear()
    rec.after_scan(150.0, {"/logs/a.log"}, False)
    rec.lost_sight_of("/logs/a.log", 0)
    assert rec._successor_paths["/logs/a.log"] == (140.0, 0)
