"""The C fast paths for tests that run each case on both paths (C and the Python reference)."""

from __future__ import annotations

from typing import Any

import pytest

from shipper import native


def c_function(name: str) -> Any:
    """`shipper._native.<name>` (or that of SHIPPER_NATIVE_MODULE, the sanitizer build); a failure,
    not a skip, when the module is not built: the suite is meant to check the C paths on every
    machine that can build them (CI can)."""
    if native.module is None:
        pytest.fail("shipper/_native.c is not built: pip install -e . (needs gcc and the Python headers)")
    return getattr(native.module, name)
