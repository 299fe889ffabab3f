"""The C fast paths (`shipper/_native.c`): each name is None when the module was not built (no
compiler at install) or when SHIPPER_PURE_PYTHON=1 is set (to rule them out, or to compare), and
the pure-Python code that stays the reference runs instead."""

from __future__ import annotations

import os
from typing import Any

PURE_PYTHON = os.environ.get("SHIPPER_PURE_PYTHON", "") not in ("", "0")

module: Any = None
try:
    from shipper import _native as module
except ImportError:   # pragma: no cover - built without a compiler
    pass

_on = module is not None and not PURE_PYTHON
splice: Any = module.splice if _on else None             # DocBuilder: JSON line -> bulk pair
split_lines: Any = module.split_lines if _on else None   # LineSplitter.feed: the complete lines
