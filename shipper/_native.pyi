"""The C fast paths' signatures (shipper/_native.c; what each argument means is written there).
shipper/native.py imports them as typed names; nothing else imports this module."""

from collections.abc import Callable

_Line = tuple[int, int, bytes, int]
_Chunk = bytes | bytearray | memoryview

def splice(events: list[_Line], out: list[bytes], head: bytes | None, prefix_for: Callable[[int], bytes],
           inc: bytes, mid: bytes, host: bytes, tail: bytes, reserved: tuple[bytes, ...],
           fallback: Callable[[_Line], int], ms_min: int, ms_max: int, ecs: tuple[int, int], /) -> int: ...
def split_lines(chunk: _Chunk, carry: _Chunk, pos: int, limit: int, truncated: int,
                /) -> tuple[list[_Line], int, int]: ...
def split_splice(chunk: _Chunk, carry: _Chunk, pos: int, limit: int, truncated: int,
                 sniff: Callable[[bytes, bytes], bool] | None, out: list[bytes], counts: dict[int, int],
                 head: bytes | None, prefix_for: Callable[[int], bytes], inc: bytes, mid: bytes, host: bytes,
                 tail: bytes, reserved: tuple[bytes, ...], fallback: Callable[[_Line], int], ms_min: int,
                 ms_max: int, ecs: tuple[int, int], /) -> tuple[int, int, int, int, int, int, int] | None: ...
