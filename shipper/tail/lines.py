"""Pure line splitting: chunks of a file -> complete lines with their byte offsets.

A partial last line waits (in the carry) for its newline. Lines longer than max_line_bytes are
cut and flagged; NUL bytes at the head of a line (the hole a writer without O_APPEND leaves
after copytruncate) are dropped; empty lines are not lines. No I/O here: the harvester feeds it.
"""

from __future__ import annotations

from shipper.model import FLAG_TRUNCATED, Line


class LineSplitter:
    """Feeds chunks read sequentially from `start_offset` and returns the complete lines.

    `offset` is the position just after the last byte consumed into complete lines (or skipped):
    the harvester may checkpoint it. `pending_start` is where the held partial line starts.
    A line that exceeds max_line_bytes before its newline is emitted at once (cut, flagged) and
    the rest of it is skipped up to the newline; until then `offset` stays at the line's start,
    so a restart re-emits the same cut line with the same offset (and the same document _id).
    """

    __slots__ = ("offset", "max_line_bytes", "_carry", "_skipping", "_skip_pos")

    def __init__(self, start_offset: int, max_line_bytes: int) -> None:
        self.offset = start_offset
        self.max_line_bytes = max_line_bytes
        self._carry = b""
        self._skipping = False   # inside an over-long line already emitted
        self._skip_pos = 0       # while skipping: the read position

    @property
    def pending_bytes(self) -> int:
        return len(self._carry)

    @property
    def read_position(self) -> int:
        """Where the next chunk must start (offset + bytes held in the carry)."""
        return self.offset + len(self._carry) if not self._skipping else self._skip_pos

    def feed(self, chunk: bytes) -> list[Line]:
        out: list[Line] = []
        if not chunk:
            return out
        limit = self.max_line_bytes
        pos = self.offset
        if self._skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                self._skip_pos += len(chunk)
                return out
            # the over-long line ends here: consume through its newline
            pos = self._skip_pos + nl + 1
            chunk = chunk[nl + 1:]
            self._skipping = False
            self.offset = pos
        data = self._carry + chunk if self._carry else chunk
        parts = data.split(b"\n")
        tail = parts.pop()
        append = out.append
        for part in parts:
            n = len(part)
            start = pos
            pos += n + 1
            if not n:
                continue
            if part[0] == 0:
                part = part.lstrip(b"\x00")
                if not part:
                    continue
                n = len(part)
            if part[-1] == 13:          # \r\n line endings
                part = part[:-1]
                n -= 1
                if not n:
                    continue
            if n > limit:
                append((start, pos, part[:limit], FLAG_TRUNCATED))
            else:
                append((start, pos, part, 0))
        self.offset = pos
        if len(tail) > limit:
            stripped = tail.lstrip(b"\x00")
            if len(stripped) > limit:
                # emit the cut line now; skip the rest of it until its newline
                append((pos, pos, stripped[:limit], FLAG_TRUNCATED))
                self._skipping = True
                self._skip_pos = pos + len(tail)
                self._carry = b""
                return out
            # NUL padding inflated it: keep it (without the NULs we would lose the offset)
        self._carry = tail
        return out

    def flush(self) -> list[Line]:
        """The file will not grow any more (deleted / rotated away): a last line without newline counts."""
        if self._skipping or not self._carry:
            return []
        tail = self._carry.lstrip(b"\x00").rstrip(b"\r")
        start = self.offset
        self.offset += len(self._carry)
        self._carry = b""
        if not tail:
            return []
        if len(tail) > self.max_line_bytes:
            return [(start, self.offset, tail[: self.max_line_bytes], FLAG_TRUNCATED)]
        return [(start, self.offset, tail, 0)]
