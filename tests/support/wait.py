"""Waiting for a condition under a deadline, for sync and async tests.

Tests never sleep to synchronise: they poll what they expect and, on timeout, fail naming it.
`what` may be a callable so the message can show the state at the moment of failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
What = str | Callable[[], str]


def _message(what: What, timeout_s: float) -> str:
    text = what() if callable(what) else what
    return f"timed out after {timeout_s}s waiting for {text}"


def wait_until(cond: Callable[[], T | None], what: What, timeout_s: float = 10.0, interval_s: float = 0.02) -> T:
    """Poll `cond` until it returns a truthy value and return that value.

    Raises AssertionError naming `what` after `timeout_s`. Exceptions from `cond` propagate.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, timeout_s))
        time.sleep(interval_s)


async def async_wait_until(
    cond: Callable[[], T | None], what: What, timeout_s: float = 10.0, interval_s: float = 0.02
) -> T:
    """The asyncio twin of `wait_until`: yields to the loop between polls."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, timeout_s))
        await asyncio.sleep(interval_s)
