"""The C fast paths for tests that run each case on both paths (C and the Python reference)."""

from __future__ import annotations

from typing import Any

import pytest


def c_function(name: str) -> Any:
    """`shipper._native.<name>`; a failure, not a skip, when the module is not built: the suite
    is meant to check the C paths on every machine that can build them (CI can)."""
    try:
        from shipper import _native
    except ImportError:
        pytest.fail("shipper/_native.c is not built: pip install -e . (needs gcc and the Python headers)")
    return getattr(_native, name)
