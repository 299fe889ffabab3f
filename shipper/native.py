"""The C fast paths (`shipper/_native.c`): each name is None when the module was not built (no
compiler at install) or when SHIPPER_PURE_PYTHON=1 is set (to rule them out, or to compare), and
the pure-Python code that stays the reference runs instead.

SHIPPER_NATIVE_MODULE=/path/to/_native.so loads the module from that file instead of the
package (the AddressSanitizer build of `.ci/run` and fuzz/; see fuzz/README.md).
"""

from __future__ import annotations

import os
import sys
from typing import Any

PURE_PYTHON = os.environ.get("SHIPPER_PURE_PYTHON", "") not in ("", "0")
MODULE_FILE = os.environ.get("SHIPPER_NATIVE_MODULE", "")


def _load(path: str) -> Any:
    """The extension from a file of its own, registered as shipper._native for every importer."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("shipper._native", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"SHIPPER_NATIVE_MODULE={path!r}: not an extension module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["shipper._native"] = mod
    return mod


module: Any = None
if MODULE_FILE:
    module = _load(MODULE_FILE)
else:
    try:
        from shipper import _native as module  # type: ignore[attr-defined,no-redef]
    except ImportError:   # pragma: no cover - built without a compiler
        pass

_on = module is not None and not PURE_PYTHON
splice: Any = module.splice if _on else None             # DocBuilder: JSON line -> bulk pair
split_lines: Any = module.split_lines if _on else None   # LineSplitter.feed: the complete lines
split_splice: Any = module.split_splice if _on else None  # both at once (DocBuilder.split_builder)
