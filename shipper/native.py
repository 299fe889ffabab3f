"""The C fast paths (shipper/_native.c), typed: each name is None when the module was not built or
SHIPPER_PURE_PYTHON=1 is set, and the pure-Python reference runs instead. SHIPPER_NATIVE_MODULE=path
loads the module from that file (the sanitizer build of fuzz/ci.sh; fuzz/README.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

PURE_PYTHON = os.environ.get("SHIPPER_PURE_PYTHON", "") not in ("", "0")
MODULE_FILE = os.environ.get("SHIPPER_NATIVE_MODULE", "")

# the signatures of shipper/_native.pyi, as the types of the names below
Line = tuple[int, int, bytes, int]
Chunk = bytes | bytearray | memoryview
Splice = Callable[[list[Line], list[bytes], bytes | None, Callable[[int], bytes], bytes, bytes, bytes, bytes,
                   tuple[bytes, ...], Callable[[Line], int], int, int, tuple[int, int]], int]
SplitLines = Callable[[Chunk, Chunk, int, int, int], tuple[list[Line], int, int]]
SplitSplice = Callable[[Chunk, Chunk, int, int, int, Callable[[bytes, bytes], bool] | None, list[bytes],
                        dict[int, int], bytes | None, Callable[[int], bytes], bytes, bytes, bytes, bytes,
                        tuple[bytes, ...], Callable[[Line], int], int, int, tuple[int, int]],
                       tuple[int, int, int, int, int, int, int] | None]


def _load(path: str) -> ModuleType:
    """The extension from a file of its own, registered as shipper._native for every importer."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("shipper._native", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"SHIPPER_NATIVE_MODULE={path!r}: not an extension module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["shipper._native"] = mod
    return mod


def _built() -> ModuleType | None:
    if MODULE_FILE:
        return _load(MODULE_FILE)
    try:
        from shipper import _native
    except ImportError:   # pragma: no cover - built without a compiler
        return None
    return _native


module = _built()
_on = module is not None and not PURE_PYTHON
splice: Splice | None = module.splice if module is not None and _on else None       # DocBuilder: JSON line -> bulk pair
split_lines: SplitLines | None = module.split_lines if module is not None and _on else None   # LineSplitter.feed
split_splice: SplitSplice | None = module.split_splice if module is not None and _on else None   # both at once

if TYPE_CHECKING:     # mypy holds the stub's signatures to the types above
    from shipper import _native as _stub
    _splice: Splice = _stub.splice
    _split_lines: SplitLines = _stub.split_lines
    _split_splice: SplitSplice = _stub.split_splice
