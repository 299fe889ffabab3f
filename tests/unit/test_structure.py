"""The shape of shipper/, read from the source with `ast` (nothing is run): no import circle, no
module over 450 lines, time read only in clock.py, no probing of our own objects, no private name
crossing a module, two-to-four-line module headers, no measurements in comments, and the module
map in docs/development.md naming exactly the modules there are.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPER = REPO / "shipper"
MAX_LINES = 450

# getattr/hasattr on objects that are not ours: (module, the probed expression) -> why
FOREIGN_PROBES = {
    ("shipper/logs.py", "logging"): "a level name from the config looked up in the logging module",
    ("shipper/service.py", "logging"): "a level name from the config looked up in the logging module",
    ("shipper/config.py", "e"): "yaml's MarkedYAMLError: problem and problem_mark exist only on some errors",
    ("shipper/spool/database.py", "e"): "sqlite3.Error: sqlite_errorcode is set on some errors only",
    ("shipper/ship/tls.py", "ssl_object"): "ssl's SSLObject: the chain's getter is public only from 3.13",
    ("shipper/ship/tls.py", "obj"): "ssl's SSLObject: the chain's getter is public only from 3.13",
    ("shipper/ship/tls.py", "inner"): "an OSError's ssl and aiohttp subclasses carry different fields",
    ("shipper/ship/sigv4.py", "creds"): "botocore's credentials: only the refreshable kind has refresh_needed",
    ("shipper/tail/inotify.py", "lib"): "libc through ctypes: inotify_init1 is missing outside Linux",
    ("shipper/tail/opening.py", "os"): "O_PATH and O_NOATIME exist only on Linux",
    ("shipper/tail/harvester.py", "_buffers"): "a threading.local: a thread's buffer exists after its first read",
    ("shipper/commands/main.py", "args"): "argparse's Namespace: only some subcommands define the flag",
    ("shipper/config_values.py", "v"): "a YAML scalar: dates and times have isoformat",
}
# private names used across a module boundary on purpose: (module, name) -> why
FOREIGN_PRIVATE = {
    ("shipper/native.py", "_native"): "the C extension's one wrapper; everything else imports shipper.native",
}
# the names of the time module that read a clock or sleep; its conversions of a given instant
# (gmtime, strftime, mktime with an argument) are calendar arithmetic, not a read of the time
TIME_READERS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
                "process_time", "process_time_ns", "thread_time", "thread_time_ns", "sleep",
                "clock_gettime", "clock_gettime_ns"}
TIME_READ_WITHOUT_ARGS = {"gmtime", "localtime", "ctime", "asctime"}   # no argument: now
# a figure in a comment or docstring: a cost in ns/us, an approximate figure, a speed-up, a rate,
# CPU seconds, a percentile. The figures live in docs/ and bench/history/, where they are dated.
MEASUREMENT = re.compile(
    r"\d[\d,.]*\s?(ns|us|µs)\b|~\s?\d[\d,.]*\s?(ms|s|MB|MiB|KB|KiB|%|x)\b"
    r"|\b\d+(\.\d+)?x (faster|slower|cheaper|dearer|what|the cost)\b|\d[\d,.]*\s?[a-z]+/s\b"
    r"|\d\s?%\s(of|less|more)\b|CPU-s\b|\bp99\b|MiB of RSS|MB of RSS")


@functools.cache
def parse(source: str) -> ast.Module:
    return ast.parse(source)


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of shipper/."""
    found = {}
    for path in sorted(SHIPPER.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The shipper modules `name` imports anywhere in its file: at the top, inside functions (a
    lazy import is still a dependency) and under TYPE_CHECKING (so is a type)."""
    known = set(known)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known and m != name}


def circles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.add(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def test_the_circle_finder_finds_circles_and_only_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == {frozenset("ab"), frozenset("cd")}
    assert circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == set()


def test_imports_of_sees_lazy_relative_and_type_only_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "shipper" / "parse"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from shipper.parse import b\n"
                              "def f():\n    from .c import thing\n    import shipper.model\n")
    known = {"shipper.parse.a", "shipper.parse.b", "shipper.parse.c", "shipper.model", "shipper.parse"}
    assert imports_of("shipper.parse.a", pkg / "a.py", known) == {"shipper.parse.b", "shipper.parse.c", "shipper.model"}


def test_no_import_circle() -> None:
    found = circles(import_graph())
    assert not found, f"import circles in shipper/ (cut where the data changes hands): {[sorted(c) for c in found]}"


def test_no_module_over_450_lines() -> None:
    long = {rel(p): n for p in modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (one job per module): {long}"


def time_reads(source: str) -> list[int]:
    """Lines that read the clock or sleep through the time module (a call, or the function passed on)."""
    tree = parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [node.lineno for a in node.names if a.name in TIME_READERS | TIME_READ_WITHOUT_ARGS]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "time":
            if node.attr in TIME_READERS:
                found.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "time"
                and node.func.attr in TIME_READ_WITHOUT_ARGS):
            found.append(node.lineno)
    return found


def test_the_time_check_sees_reads_and_passes_conversions() -> None:
    assert time_reads("import time\nx = time.monotonic()\ndef f(c=time.time_ns): pass\n") == [2, 3]
    assert time_reads("from time import monotonic\n") == [1]
    assert time_reads("import time\ny = time.localtime()\n") == [2]
    assert time_reads("import time\ns = time.strftime('%Y', time.gmtime(now))\n") == []


def test_time_is_read_only_through_the_clock() -> None:
    """One clock: a read of time.monotonic() beside the injected Clock makes fake-clock tests pass
    for the wrong reason."""
    reading = {rel(p): lines for p in modules().values()
               if p != SHIPPER / "clock.py" and (lines := time_reads(p.read_text()))}
    assert not reading, f"time read outside clock.py (inject the Clock): {reading}"


def probes(source: str) -> list[tuple[int, str]]:
    """getattr/hasattr calls: (line, the probed expression)."""
    return [(node.lineno, ast.unparse(node.args[0])) for node in ast.walk(parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr") and node.args]


def test_no_probing_of_our_own_objects() -> None:
    """Seams are Protocols that name every method their callers use, not getattr/hasattr."""
    found = {(rel(p), what): line for p in modules().values() for line, what in probes(p.read_text())}
    ours = {k: v for k, v in found.items() if k not in FOREIGN_PROBES}
    assert not ours, f"getattr/hasattr probing (a Protocol method instead; foreign objects go in FOREIGN_PROBES " \
                     f"with a reason): {ours}"
    assert not set(FOREIGN_PROBES) - set(found), f"stale FOREIGN_PROBES: {set(FOREIGN_PROBES) - set(found)}"


def private_crossings(source: str, shipper_modules: Iterable[str]) -> list[tuple[int, str]]:
    """Private names this module takes from another: `from shipper.x import _y`, `mod._y` on an
    imported shipper module, and `obj._y` on anything but self/cls where this module defines no `_y`."""
    tree = parse(source)
    shipper_modules = set(shipper_modules)
    own: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("shipper")):
            base = node.module or ""
            aliases |= {a.asname or a.name for a in node.names if f"{base}.{a.name}" in shipper_modules
                        or (node.level and not base)}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name in shipper_modules}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("shipper")):
            found += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            on = node.value
            if isinstance(on, ast.Name) and on.id in ("self", "cls"):
                continue
            if (isinstance(on, ast.Name) and on.id in aliases) or node.attr not in own:
                found.append((node.lineno, f"{ast.unparse(on)}.{node.attr}"))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_private_check_sees_reach_ins() -> None:
    mods = {"shipper.parse.document", "shipper.parse"}
    assert private_crossings("from shipper.parse.doc_values import _merge\n", mods) == [(1, "_merge")]
    assert private_crossings("from shipper.parse import document as d\nx = d._dumps\n", mods) == [(2, "d._dumps")]
    assert private_crossings("def f(b):\n    return b._prefix\n", mods) == [(2, "b._prefix")]
    assert private_crossings("class A:\n    def __init__(self):\n        self._x = 1\n"
                             "    def same(self, other):\n        return other._x\n", mods) == []


def test_no_private_name_crosses_a_module() -> None:
    """Two modules that reach into each other's private names are one module split in the wrong place."""
    mods = modules()
    found = {}
    for path in mods.values():
        crossings = [(line, what) for line, what in private_crossings(path.read_text(), mods)
                     if (rel(path), what) not in FOREIGN_PRIVATE]
        if crossings:
            found[rel(path)] = crossings
    assert not found, f"private names across modules: {found}"


def header_lines(source: str) -> int:
    doc = ast.get_docstring(parse(source), clean=True)
    return len(doc.strip().splitlines()) if doc else 0


def test_module_headers_are_two_to_four_lines() -> None:
    """Each module opens with what it owns, what it must not do, and where its data comes from and
    goes: two to four lines. The rest is the module map's (docs/development.md) or a docstring's."""
    off = {rel(p): n for p in modules().values() if not 2 <= (n := header_lines(p.read_text())) <= 4}
    assert not off, f"module headers not 2-4 lines: {off}"


def measurements(source: str) -> list[tuple[int, str]]:
    """Figures in comments and docstrings: (line, the figure)."""
    texts = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0].lineno
                texts += [(first + i, text) for i, text in enumerate(doc.splitlines())]
    return [(line, m.group(0)) for line, text in texts if (m := MEASUREMENT.search(text))]


def test_the_measurement_check_sees_figures() -> None:
    assert measurements("x = 1  # costs ~100 us of CPU\n") == [(1, "100 us")]
    assert measurements('"""gzip is 5x faster than zlib."""\n') == [(1, "5x faster")]
    assert measurements("x = 1  # 1,000 waits/s here\n") == [(1, "1,000 waits/s")]
    assert measurements("x = 1  # every 2 s, at most 64 MiB, HTTP/1.x\n") == []


def test_no_measurements_in_code_comments() -> None:
    """Figures belong in docs/development.md or bench/history/, dated; a comment keeps the reason."""
    found = {rel(p): m for p in modules().values() if (m := measurements(p.read_text()))}
    assert not found, f"measurements in comments (docs/development.md's table has a place for them): {found}"


def mapped_modules(text: str) -> set[str]:
    """The modules docs/development.md's map names: the indented block that starts at `shipper/`,
    a folder's line standing for its `__init__.py`, each module under the nearest folder above it
    with less indentation. Continuation lines (no `.py` or `/` first word) are skipped."""
    lines = text.splitlines()
    start = lines.index("    shipper/")
    found = {"shipper/__init__.py"}
    folders = [(4, "shipper")]
    for line in lines[start + 1:]:
        if not line.strip():
            break
        indent = len(line) - len(line.lstrip())
        word = line.split()[0]
        if not (word.endswith(".py") or word.endswith("/")):
            continue
        while folders[-1][0] >= indent:
            folders.pop()
        path = f"{folders[-1][1]}/{word.rstrip('/')}"
        if word.endswith("/"):
            folders.append((indent, path))
            found.add(f"{path}/__init__.py")
        else:
            found.add(path)
    return found


def test_the_module_map_reader_follows_folders() -> None:
    text = ("x\n    shipper/\n      model.py   values\n      tail/      files\n        scan.py   globs\n"
            "                  more words\n      service.py   lifecycle\n\nafter.py\n")
    assert mapped_modules(text) == {"shipper/__init__.py", "shipper/model.py", "shipper/tail/__init__.py",
                                    "shipper/tail/scan.py", "shipper/service.py"}


def test_the_module_map_is_true_to_the_code() -> None:
    """docs/development.md is the map of record: every module is on it, and it names no module that is gone."""
    mapped = mapped_modules((REPO / "docs" / "development.md").read_text())
    actual = {rel(p) for p in modules().values()}
    assert not actual - mapped, f"modules missing from docs/development.md's map: {sorted(actual - mapped)}"
    assert not mapped - actual, f"docs/development.md's map names modules that do not exist: {sorted(mapped - actual)}"


def test_mypy_checks_the_tests_too() -> None:
    """The type gate covers tests/ (relaxed): a test that calls a seam with the wrong types fails it."""
    import tomllib
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert {"shipper", "bench", "tests"} <= set(mypy["files"]) and mypy["strict"] is True
    relaxed = [o for o in mypy["overrides"] if "tests.*" in o["module"]]
    assert relaxed and relaxed[0].get("check_untyped_defs") is True
