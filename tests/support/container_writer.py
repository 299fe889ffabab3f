"""Container runtimes' log files, byte for byte: Docker's json-file driver, containerd's and CRI-O's CRI format.

What each one does with a container's output (checked against their sources and tests, see
tests/unit/test_container_writer.py):
  dockerd (daemon/logger/copier.go + jsonfilelog): the output of one stream is cut at each `\\n`;
      a line longer than 16 KiB leaves as 16 KiB pieces without `\\n` and a last piece with it
      (a line of exactly k*16 KiB ends in a piece `"\\n"`); every piece of one line carries the
      line's first time; the unterminated rest at EOF gets a `\\n` too. Each piece is one line
      `{"log":...,"stream":...,["attrs":...,]"time":...}\\n`, `log` escaped as jsonlog does
      (`<>&` as `\\u003c`..., other controls `\\u00XX` but `\\n` `\\r`, bad UTF-8 as `\\ufffd`,
      U+2028/9 escaped), `time` in Go's RFC3339Nano in UTC (fraction's trailing zeros dropped).
  containerd (pkg/cri/io/logger.go): `<RFC3339Nano, local zone> <stream> <P|F> <text>\\n`; the
      line's `\\n` or `\\r\\n` is dropped; a line longer than max_container_log_line_size (16 KiB
      default) leaves as `P` pieces of that size and an `F` rest; the unterminated rest at EOF is `P`.
  CRI-O (conmon): the same shape with a fixed 9-digit fraction and a `+00:00` style zone; pieces
      of conmon's 8 KiB buffer.
No mocks: the helpers return bytes or append them to real files with O_APPEND, as the runtimes do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from tests.support import promptness

DOCKER_PIECE = 16 * 1024
CONTAINERD_MAX_LINE = 16 * 1024
CONMON_BUF = 8 * 1024
_HEX = "0123456789abcdef"


# ------------------------------------------------------------------ time, as Go formats it

def go_rfc3339nano(t_ns: int, offset_s: int | None = 0, *, fixed_nanos: bool = False) -> str:
    """Go's time.Format(time.RFC3339Nano) of epoch nanoseconds in a zone `offset_s` east of UTC
    (0: `Z`); `fixed_nanos`: conmon's `%09ld` fraction and `+00:00` zone instead."""
    off = offset_s or 0
    sec, ns = divmod(t_ns, 1_000_000_000)
    tm = time.gmtime(sec + off)
    head = (f"{tm.tm_year:04d}-{tm.tm_mon:02d}-{tm.tm_mday:02d}"
            f"T{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}")
    if fixed_nanos:
        frac = f".{ns:09d}"
    else:
        frac = f".{ns:09d}".rstrip("0")
        if frac == ".":
            frac = ""
    if off == 0 and not fixed_nanos:
        zone = "Z"
    else:
        sign = "-" if off < 0 else "+"
        a = abs(off)
        zone = f"{sign}{a // 3600:02d}:{a % 3600 // 60:02d}"
    return head + frac + zone


ZERO_TIME_NS = -62135596800 * 1_000_000_000   # Go's zero time.Time: 0001-01-01T00:00:00Z


# ------------------------------------------------------------------ dockerd json-file

def docker_escape(raw: bytes) -> bytes:
    """`log` as jsonlog's ffjsonWriteJSONBytesAsString writes it, quotes included."""
    out = bytearray(b'"')
    i = 0
    n = len(raw)
    while i < n:
        b = raw[i]
        if b < 0x80:
            if 0x20 <= b and b not in (0x5C, 0x22, 0x3C, 0x3E, 0x26):
                out.append(b)
            elif b in (0x5C, 0x22):
                out += b"\\" + bytes((b,))
            elif b == 0x0A:
                out += b"\\n"
            elif b == 0x0D:
                out += b"\\r"
            else:
                out += b"\\u00" + _HEX[b >> 4].encode() + _HEX[b & 0xF].encode()
            i += 1
            continue
        size = _utf8_len(raw, i)
        if size == 0:
            out += b"\\ufffd"          # Go: utf8.RuneError of size 1
            i += 1
            continue
        ch = raw[i:i + size].decode("utf-8")
        if ch in ("\u2028", "\u2029"):
            out += b"\\u202" + _HEX[ord(ch) & 0xF].encode()
        else:
            out += raw[i:i + size]
        i += size
    out += b'"'
    return bytes(out)


def _utf8_len(raw: bytes, i: int) -> int:
    """Length of the valid UTF-8 sequence at i, 0 when invalid (as Go's utf8.DecodeRune sees it)."""
    for size in (2, 3, 4):
        try:
            raw[i:i + size].decode("utf-8")
            return size
        except UnicodeDecodeError:
            continue
    return 0


def docker_record(log: bytes, stream: str, t_ns: int, attrs: bytes | None = None) -> bytes:
    """One json-file line (with its newline) for one message piece `log` (newline included or not)."""
    parts = [b"{"]
    if log:
        parts += [b'"log":', docker_escape(log)]
    if stream:
        parts += [b"," if log else b"", b'"stream":', docker_escape(stream.encode())]
    if attrs:
        parts += [b"," if (log or stream) else b"", b'"attrs":', attrs]
    parts += [b"," if (log or stream or attrs) else b"", b'"time":"', go_rfc3339nano(t_ns).encode(), b'"}\n']
    return b"".join(parts)


def docker_pieces(message: bytes, stream: str, t_ns: int, attrs: bytes | None = None,
                  *, terminated: bool = True) -> list[bytes]:
    """The json-file lines dockerd writes for one line of output (`message` without its `\\n`):
    16 KiB pieces without newline, then the rest with it (`"\\n"` alone after a line of exactly
    k*16 KiB). `terminated=False`: the output ended without a newline (EOF): the rest is marked
    the last piece, so it gets the `\\n` all the same, unless there is no rest (a full buffer
    went out as a partial before EOF was seen): then the record is never completed."""
    full = len(message) // DOCKER_PIECE
    out = [docker_record(message[i * DOCKER_PIECE:(i + 1) * DOCKER_PIECE], stream, t_ns, attrs)
           for i in range(full)]
    rest = message[full * DOCKER_PIECE:]
    if terminated or rest:
        out.append(docker_record(rest + b"\n", stream, t_ns, attrs))
    return out


def dockerd_output(output: bytes, stream: str, clock: Iterator[int], attrs: bytes | None = None) -> list[bytes]:
    """All json-file lines for a stream's raw output, one time from `clock` per line."""
    lines = output.split(b"\n")
    tail = lines.pop()
    out: list[bytes] = []
    for ln in lines:
        out += docker_pieces(ln, stream, next(clock), attrs)
    if tail:
        out += docker_pieces(tail, stream, next(clock), attrs, terminated=False)
    return out


# ------------------------------------------------------------------ CRI: containerd, CRI-O

Runtime = Literal["containerd", "crio"]


def cri_record(text: bytes, stream: str, tag: str, t_ns: int, runtime: Runtime = "containerd",
               offset_s: int = 0) -> bytes:
    ts = go_rfc3339nano(t_ns, offset_s, fixed_nanos=runtime == "crio")
    return b"%s %s %s %s\n" % (ts.encode(), stream.encode(), tag.encode(), text)


def cri_pieces(message: bytes, stream: str, t_ns: int, max_len: int = CONTAINERD_MAX_LINE,
               runtime: Runtime = "containerd", *, terminated: bool = True, offset_s: int = 0) -> list[bytes]:
    """The CRI lines for one line of output (`message` without its newline; a final `\\r` of a
    CRLF line is dropped, as containerd does): `P` pieces of `max_len` bytes while more than
    `max_len` remain, then the rest as `F` (`P` when the output ended without a newline)."""
    if terminated and message.endswith(b"\r"):
        message = message[:-1]
    out = []
    while len(message) > max_len:
        out.append(cri_record(message[:max_len], stream, "P", t_ns, runtime, offset_s))
        message = message[max_len:]
    out.append(cri_record(message, stream, "F" if terminated else "P", t_ns, runtime, offset_s))
    return out


def cri_output(output: bytes, stream: str, clock: Iterator[int], max_len: int = CONTAINERD_MAX_LINE,
               runtime: Runtime = "containerd") -> list[bytes]:
    """All CRI lines for a stream's raw output, one time from `clock` per piece written."""
    lines = output.split(b"\n")
    tail = lines.pop()
    out: list[bytes] = []
    for ln in lines:
        for rec in cri_pieces(ln, stream, 0, max_len, runtime):
            out.append(_retime(rec, next(clock), runtime))
    if tail:
        for rec in cri_pieces(tail, stream, 0, max_len, runtime, terminated=False):
            out.append(_retime(rec, next(clock), runtime))
    return out


def _retime(rec: bytes, t_ns: int, runtime: Runtime) -> bytes:
    sp = rec.index(b" ")
    return go_rfc3339nano(t_ns, 0, fixed_nanos=runtime == "crio").encode() + rec[sp:]


def ticks(start_ns: int = 1_796_119_200_000_000_000, step_ns: int = 1_234_567) -> Iterator[int]:
    """A runtime's clock: increasing nanoseconds."""
    t = start_ns
    while True:
        yield t
        t += step_ns


# ------------------------------------------------------------------ writers on real files

class RuntimeLog:
    """A log file a runtime appends to (O_APPEND, one write per record, as both runtimes do);
    `reopen()` is what containerd/CRI-O do on kubelet's ReopenContainerLog (and dockerd after its
    own rotation): the path is opened anew, created when it is missing."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

    def write_records(self, records: Iterable[bytes]) -> None:
        for rec in records:
            os.write(self._fd, rec)
            promptness.note_written(rec)

    def write_partial(self, record: bytes, upto: int) -> None:
        """Only the first `upto` bytes of a record: a write the reader catches half done."""
        os.write(self._fd, record[:upto])

    def reopen(self) -> None:
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

    def close(self) -> None:
        os.close(self._fd)


def interleave(a: Sequence[bytes], b: Sequence[bytes], pattern: Sequence[int]) -> list[bytes]:
    """Merge two streams' records keeping each one's order: pattern[i] says which stream's next
    record comes next (0: a, 1: b); the rest of both follows."""
    out: list[bytes] = []
    ia = ib = 0
    for which in pattern:
        if which == 0 and ia < len(a):
            out.append(a[ia])
            ia += 1
        elif which == 1 and ib < len(b):
            out.append(b[ib])
            ib += 1
    out += a[ia:]
    out += b[ib:]
    return out
