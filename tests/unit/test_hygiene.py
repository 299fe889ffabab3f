"""How the tests themselves are written: a poll always has a deadline (tests/support/wait.py), and
there is one fake clock and one recording Events, both in tests/support/fake_clock.py.

Read from the source with `ast`; nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SUPPORT = TESTS / "support"


def _test_sources() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def _is_sleep(node: ast.stmt) -> bool:
    """`await asyncio.sleep(...)` or `time.sleep(...)` as a statement."""
    if not isinstance(node, ast.Expr):
        return False
    call = node.value.value if isinstance(node.value, ast.Await) else node.value
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "sleep"
            and isinstance(call.func.value, ast.Name) and call.func.value.id in ("asyncio", "time"))


def _under_a_timeout(parents: list[ast.AST]) -> bool:
    """Inside `async with asyncio.timeout(...)` (the deadline is the block's)."""
    for p in parents:
        if isinstance(p, ast.AsyncWith):
            for item in p.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "timeout":
                    return True
    return False


def polls_without_a_deadline(source: str) -> list[int]:
    """Lines of `while <condition>: <sleep>` loops whose only way out is the condition: no deadline
    in the condition, no `asyncio.timeout` around them."""
    found: list[int] = []

    def visit(node: ast.AST, parents: list[ast.AST]) -> None:
        if (isinstance(node, ast.While) and len(node.body) == 1 and _is_sleep(node.body[0])
                and "deadline" not in ast.unparse(node.test) and not _under_a_timeout(parents)):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, [*parents, node])

    visit(ast.parse(source), [])
    return found


def test_every_poll_has_a_deadline() -> None:
    bad = [f"{path.relative_to(REPO)}:{line}" for path in _test_sources()
           for line in polls_without_a_deadline(path.read_text())]
    assert not bad, f"polls without a deadline (use tests/support/wait.py's async_wait_until/wait_until): {bad}"


def test_the_poll_check_sees_a_bare_poll_and_passes_a_bounded_one() -> None:
    assert polls_without_a_deadline(
        "async def f():\n    while not done:\n        await asyncio.sleep(0.01)\n") == [2]
    assert polls_without_a_deadline("def f():\n    while x < 5:\n        time.sleep(0.1)\n") == [2]
    assert polls_without_a_deadline(
        "def f():\n    while x < 5 and time.monotonic() < deadline:\n        time.sleep(0.1)\n") == []
    assert polls_without_a_deadline(
        "async def f():\n    async with asyncio.timeout(10):\n        while x:\n            await asyncio.sleep(0)\n") == []
    assert polls_without_a_deadline(                    # a loop that does work besides sleeping is not a poll
        "async def f():\n    while x:\n        step()\n        await asyncio.sleep(0)\n") == []


def test_one_fake_clock_and_one_recording_events() -> None:
    """A second fake clock or recording Events drifts from the one every other test uses."""
    extra = []
    for path in _test_sources():
        if path.is_relative_to(SUPPORT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            if "Events" in bases or {"monotonic", "sleep"} <= methods:
                extra.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not extra, f"use tests/support/fake_clock.py's FakeClock and RecordingEvents instead of: {extra}"
