"""Pure line splitting: chunks of a file -> complete lines with their byte offsets; a partial last line
waits in the carry, an over-long one is cut and flagged, head NULs (a copytruncate's hole) dropped.
The harvester feeds it; the loop runs in C when _native.c is built, this file is its reference."""

from __future__ import annotations

from dataclasses import dataclass

from shipper import native
from shipper.model import FLAG_TRUNCATED, Line, SplitBuild

native_split_lines = native.split_lines   # the loop over complete lines in C, or None (shipper/native.py)
_NATIVE_POS_MAX = 2 ** 62                  # the C loop counts offsets in 64 bits; past this, Python's ints


@dataclass(slots=True)
class Built:
    """The complete lines of a chunk that `feed_built` had built as they were split."""

    lines: int = 0          # how many (whatever the builder made of each)
    first: int = -1         # the first one's start and the last one's end; -1 without lines
    last: int = -1
    nbytes: int = 0         # the bytes the builder appended
    pairs: int = 0          # the bulk pairs in them


class LineSplitter:
    """Feeds chunks read sequentially from `start_offset` and returns the complete lines.

    `offset` is the position just after the last byte consumed into complete lines (or skipped):
    the harvester may checkpoint it. A line's start is its first byte that is not a head NUL, so
    the NUL hole of a copytruncate is consumed as it is read (never held in memory) and a line's
    offset does not depend on how the file was chunked. A line that exceeds max_line_bytes before
    its newline is emitted at once (cut, flagged; its `end` is its start, the real end is not
    known yet) and the rest of it is skipped up to the newline; until then `offset` stays at the
    line's start, so a restart re-emits the same cut line with the same offset (and the same _id).
    """

    __slots__ = ("offset", "max_line_bytes", "native", "_carry", "_skipping", "_skip_pos")

    def __init__(self, start_offset: int, max_line_bytes: int) -> None:
        self.offset = start_offset
        self.max_line_bytes = max_line_bytes
        self.native = native_split_lines      # None: the loop below (tests run both)
        self._carry = b""
        self._skipping = False   # inside an over-long line already emitted
        self._skip_pos = 0       # while skipping: the read position

    @property
    def pending_bytes(self) -> int:
        return len(self._carry)

    @property
    def skipping(self) -> bool:
        """Inside a line over max_line_bytes, emitted cut: its rest is skipped up to its newline."""
        return self._skipping

    @property
    def read_position(self) -> int:
        """Where the next chunk must start (offset + bytes held in the carry)."""
        return self.offset + len(self._carry) if not self._skipping else self._skip_pos

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[Line]:
        """The lines `chunk` completes. Any bytes-like chunk; the lines and the carry are bytes."""
        out: list[Line] = []
        if not chunk:
            return out
        limit = self.max_line_bytes
        if self._skipping:
            nl = (bytes(chunk) if type(chunk) is memoryview else chunk).find(b"\n")
            if nl < 0:
                self._skip_pos += len(chunk)
                return out
            # the over-long line ends here: consume through its newline
            self.offset = self._skip_pos + nl + 1
            chunk = chunk[nl + 1:]
            self._skipping = False
        pos = self.offset
        if self.native is not None and pos <= _NATIVE_POS_MAX:
            out, pos, t = self.native(chunk, self._carry, pos, limit, FLAG_TRUNCATED)
            tail = chunk[t:] if t else self._carry + chunk
            # bytes(): the carry never holds a view of (or shares) the caller's buffer
            return self._keep_tail(out, pos, tail if type(tail) is bytes else bytes(tail))
        parts = (chunk if type(chunk) is bytes else bytes(chunk)).split(b"\n")
        if self._carry:
            parts[0] = self._carry + parts[0]     # not carry + chunk: that copies the whole chunk again
        tail = parts.pop()
        append = out.append
        for part in parts:
            n = len(part)
            start = pos
            pos += n + 1
            if not n:
                continue
            if part[0] == 0:
                stripped = part.lstrip(b"\x00")
                start += n - len(stripped)
                part = stripped
                n = len(part)
                if not n:
                    continue
            if part[-1] == 13:          # \r\n line endings
                part = part[:-1]
                n -= 1
                if not n:
                    continue
            if n > limit:
                append((start, pos, part[:limit], FLAG_TRUNCATED))
            else:
                append((start, pos, part, 0))
        return self._keep_tail(out, pos, tail)

    def skip_zeros(self, n: int) -> list[Line]:
        """`feed(bytes(n))` without the bytes (a hole of a sparse file, skipped unread): at the
        start of a line they are head NULs, consumed; inside an over-long line already emitted,
        skipped; inside a line, its bytes (at most max_line_bytes + 2 of them are fed: by then
        the line is cut and the rest skipped). The lines it completes (a cut one, at most)."""
        if n <= 0:
            return []
        if self._skipping:
            self._skip_pos += n
            return []
        if not self._carry:
            self.offset += n
            return []
        k = min(n, self.max_line_bytes + 2)
        out = self.feed(bytes(k))
        if n > k:
            self._skip_pos += n - k           # carry + k NULs is over the limit: skipping now
        return out

    def feed_built(self, chunk: bytes | bytearray | memoryview, split: SplitBuild) -> tuple[list[Line], Built]:
        """`feed`, with the complete lines handed to `split`'s builder as they are found instead of
        being returned: (the lines still to build, in order after the built ones; what was built).
        Where `split` cannot take the chunk (an offset past the C loop's, a possible cut line at
        its end, a builder that declines it) this is `feed` itself: (its lines, nothing built)."""
        if not chunk or self._skipping or self.offset > _NATIVE_POS_MAX or self.native is None:
            return self.feed(chunk), Built()
        carry = self._carry
        r = split(chunk, carry, self.offset, self.max_line_bytes, FLAG_TRUNCATED)
        if r is None:
            return self.feed(chunk), Built()
        pos, t, n, first, last, nbytes, pairs = r
        tail = chunk[t:] if t else carry + chunk
        out = self._keep_tail([], pos, tail if type(tail) is bytes else bytes(tail))
        return out, Built(n, first, last, nbytes, pairs)

    def _keep_tail(self, out: list[Line], pos: int, tail: bytes) -> list[Line]:
        """After the complete lines up to `pos`: hold the unterminated `tail`, or emit it cut."""
        limit = self.max_line_bytes
        if tail[:1] == b"\x00":
            # head NULs of the next line: consumed now, so a hole of any size costs no memory
            stripped = tail.lstrip(b"\x00")
            pos += len(tail) - len(stripped)
            tail = stripped
        self.offset = pos
        n = len(tail)
        # over the limit for sure: more than limit + 1 bytes, or limit + 1 without a \r that a \n could follow
        if n > limit and (n > limit + 1 or tail[-1] != 13):
            out.append((pos, pos, tail[:limit], FLAG_TRUNCATED))
            self._skipping = True
            self._skip_pos = pos + n
            self._carry = b""
            return out
        self._carry = tail
        return out

    def flush(self) -> list[Line]:
        """The file will not grow any more (deleted / rotated away): a last line without newline counts."""
        if self._skipping or not self._carry:
            return []
        tail = self._carry
        if tail[-1] == 13:
            tail = tail[:-1]
        start = self.offset
        self.offset += len(self._carry)
        self._carry = b""
        if not tail:
            return []
        if len(tail) > self.max_line_bytes:
            return [(start, self.offset, tail[: self.max_line_bytes], FLAG_TRUNCATED)]
        return [(start, self.offset, tail, 0)]
