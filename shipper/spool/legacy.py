"""Rows that older versions let diskcache pickle, read as data: never unpickled. Pure: `read_pickle`
walks a pickle's opcodes (pickletools.genops, which runs nothing) with a stack of its own that builds
only dicts, lists, tuples, str, bytes, numbers, booleans and None; anything else is `NotData`."""

from __future__ import annotations

import pickletools
from typing import Any

MAX_DEPTH = 16            # the old rows nest 3 deep (batch meta -> "cp" -> a checkpoint)


class NotData(ValueError):
    """Bytes that are not a pickle of plain data."""


_MARK = object()

# opcodes whose argument, as genops decodes it, is the value pushed
_SCALARS = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
    "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8",
})
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_DICT": dict, "EMPTY_LIST": list}
_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})


def _to_mark(stack: list[Any]) -> list[Any]:
    """The items above the topmost mark, which is removed with them."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise NotData("no mark on the stack")


def _pairs(items: list[Any]) -> list[tuple[Any, Any]]:
    if len(items) % 2:
        raise NotData("an odd number of items for a dict")
    return list(zip(items[::2], items[1::2], strict=True))


def _step(name: str, arg: Any, stack: list[Any], memo: dict[int, Any]) -> None:
    if name in _SCALARS:
        stack.append(bytes(arg) if isinstance(arg, bytearray) else arg)
    elif name in _CONSTANTS:
        stack.append(_CONSTANTS[name])
    elif name in _EMPTY:
        stack.append(_EMPTY[name]())
    elif name == "EMPTY_TUPLE":
        stack.append(())
    elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(name[-1])
        if len(stack) < n:
            raise NotData("stack underflow")
        items = stack[-n:]
        del stack[-n:]
        stack.append(tuple(items))
    elif name == "TUPLE":
        stack.append(tuple(_to_mark(stack)))
    elif name == "LIST":
        stack.append(_to_mark(stack))
    elif name == "DICT":
        stack.append(dict(_pairs(_to_mark(stack))))
    elif name == "MARK":
        stack.append(_MARK)
    elif name == "APPEND":
        v = stack.pop()
        _top(stack, list).append(v)
    elif name == "APPENDS":
        items = _to_mark(stack)
        _top(stack, list).extend(items)
    elif name == "SETITEM":
        v = stack.pop()
        k = stack.pop()
        _top(stack, dict)[k] = v
    elif name == "SETITEMS":
        pairs = _pairs(_to_mark(stack))
        _top(stack, dict).update(pairs)
    elif name == "MEMOIZE":
        memo[len(memo)] = _top(stack, object)
    elif name in _PUT:
        memo[int(arg)] = _top(stack, object)
    elif name in _GET:
        if arg not in memo:
            raise NotData(f"memo {arg} read before it is written")
        stack.append(memo[arg])
    elif name == "POP":
        stack.pop()
    elif name == "POP_MARK":
        _to_mark(stack)
    elif name == "DUP":
        stack.append(_top(stack, object))
    else:
        raise NotData(f"a pickle that is not plain data (opcode {name})")


def _top(stack: list[Any], kind: type) -> Any:
    if not stack or stack[-1] is _MARK or not isinstance(stack[-1], kind):
        raise NotData(f"no {kind.__name__} on the stack")
    return stack[-1]


def _copy(v: Any, depth: int, budget: list[int]) -> Any:
    """A tree copy of what the stack machine built (the memo may share a container twice), within
    a budget of nodes: shared containers cannot make a small pickle into a huge value."""
    budget[0] -= 1
    if budget[0] < 0:
        raise NotData("more values than the pickle's length allows")
    if depth > MAX_DEPTH:
        raise NotData("nested too deep")
    if isinstance(v, dict):
        return {_copy(k, depth + 1, budget): _copy(x, depth + 1, budget) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x, depth + 1, budget) for x in v]
    if isinstance(v, tuple):
        return tuple(_copy(x, depth + 1, budget) for x in v)
    return v


def read_pickle(data: bytes | memoryview) -> Any:
    """The plain data a pickle holds, without unpickling it. Raises NotData.

    b19ade4 and earlier stored checkpoints, dead letters, quarantined rows and (073664d and
    earlier) batch metadata as pickled dicts, and put a pickle inside each batch row's header.
    Whoever can write a state dir can plant a pickle that runs code when unpickled, so these
    bytes are never given to `pickle`: any opcode that is not data (a global, a call, a build, a
    persistent id) is refused.
    """
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    raw = bytes(data)
    try:
        for op, arg, _pos in pickletools.genops(raw):
            if op.name in ("PROTO", "FRAME"):
                continue
            if op.name == "STOP":
                break
            _step(op.name, arg, stack, memo)
        else:
            raise NotData("the pickle does not end")
    except NotData:
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError) as e:
        raise NotData(f"not a pickle of plain data ({type(e).__name__}: {e})") from e
    if len(stack) != 1 or stack[0] is _MARK:
        raise NotData("the pickle does not leave one value")
    try:
        return _copy(stack[0], 0, [len(raw) + 16])
    except TypeError as e:          # an unhashable key
        raise NotData(f"not a pickle of plain data ({e})") from e
