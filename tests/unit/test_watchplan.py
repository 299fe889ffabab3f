"""Which directories a glob leads the watcher to (shipper/tail/watchplan.py): a name at a time, as
glob.py matches, no deeper than the glob reaches (a `**`: MAX_DEPTH levels below its fixed part)."""

from __future__ import annotations

from pathlib import Path

from shipper.tail.scan import MAX_DEPTH
from shipper.tail.watchplan import Glob, GlobTable, glob_root


def start(table: GlobTable, *parts: str, level: int = 0, symlinks: str = "owner") -> frozenset[tuple[int, int, int]]:
    return table.closure([(table.index(Glob(tuple(parts), symlinks)), 0, level)])  # type: ignore[arg-type]


def walk(table: GlobTable, items: frozenset[tuple[int, int, int]], *names: str) -> frozenset[tuple[int, int, int]]:
    for n in names:
        items = table.step(items, n)
    return items


def test_a_glob_is_followed_a_part_at_a_time_and_no_deeper() -> None:
    t = GlobTable()
    root = start(t, "*", "app")                      # base/*/app/*.log
    assert t.descends(root)
    assert walk(t, root, "svc") and t.descends(walk(t, root, "svc"))
    assert walk(t, root, "svc", "app") and not t.descends(walk(t, root, "svc", "app"))
    assert not walk(t, root, "svc", "other")         # no file of the glob can be there or below
    assert not walk(t, root, "svc", "app", "deeper")
    flat = start(t)                                  # base/*.log: the base only
    assert flat and not t.descends(flat) and not t.step(flat, "x")


def test_hidden_names_as_glob_matches_them() -> None:
    t = GlobTable()
    assert not walk(t, start(t, "*"), ".git")
    assert walk(t, start(t, ".*"), ".git")
    assert walk(t, start(t, ".h"), ".h")             # a literal part matches its name
    assert not walk(t, start(t, "**"), ".git")       # ** skips hidden directories
    assert walk(t, start(t, "**", ".h"), "a", ".h")


def test_double_star_reaches_max_depth_levels_below_the_fixed_part() -> None:
    t = GlobTable()
    items = start(t, "**")
    for _ in range(MAX_DEPTH):
        items = t.step(items, "l")
        assert items
    assert not t.descends(items)
    assert not t.step(items, "l")
    # a part after ** may match one level more, as glob's walk yields the 8th level's directories
    tail = walk(t, start(t, "**", "x"), *["l"] * MAX_DEPTH)
    assert t.descends(tail) and walk(t, tail, "x") and not walk(t, tail, "y")
    # a missing fixed part counts from where it will be: levels above it are negative
    missing = start(t, "app", "**", level=-1)
    assert walk(t, missing, "app", *["l"] * MAX_DEPTH) and not walk(t, missing, "app", *["l"] * (MAX_DEPTH + 1))


def test_the_most_permissive_rule_of_the_globs_that_lead_there() -> None:
    t = GlobTable()
    assert t.rule(start(t, "**", symlinks="none")) == "none"
    assert t.rule(start(t, "**", symlinks="none") | start(t, "*", symlinks="owner")) == "owner"
    assert t.rule(start(t, "**", symlinks="all") | start(t, "*", symlinks="owner")) == "all"


def test_the_root_is_the_fixed_part_or_its_nearest_existing_parent(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    assert glob_root(f"{tmp_path}/logs/*/app/*.log", "owner") == (f"{tmp_path}/logs", Glob(("*", "app"), "owner"), 0)
    assert glob_root(f"{tmp_path}/logs/**", "owner") == (f"{tmp_path}/logs", Glob(("**",), "owner"), 0)
    assert glob_root(f"{tmp_path}/gone/x/**/*.log", "none") == (str(tmp_path), Glob(("gone", "x", "**"), "none"), -2)
    assert glob_root(f"{tmp_path}/logs/app.log", "owner") == (f"{tmp_path}/logs", Glob((), "owner"), 0)
