"""Log writers for tests: realistic pino NDJSON lines, appended the way applications append.

Every line carries `"seq": N` so an oracle can check that each written line is in
Elasticsearch exactly once, and when each was written is reported to the test's promptness
timeline (tests/support/promptness.py) once its bytes are written. Files are written with
O_APPEND unless a test asks otherwise.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.support import promptness

_METHODS = ("GET", "GET", "GET", "POST", "PUT", "DELETE")
_ROUTES = ("/api/items", "/api/users", "/api/orders", "/health", "/api/search", "/api/cart")
_STATUS = (200, 200, 200, 201, 204, 304, 404, 500)
_MESSAGES = ("request completed", "request completed", "cache miss", "db query slow", "user authenticated")


def pino_line(seq: int, **extra: Any) -> bytes:
    """One pino NDJSON line (~250-300 bytes with a trailing newline) for sequence number `seq`.

    Deterministic except `time` (now, epoch ms) unless given; keys in `extra` are added or
    override the defaults (e.g. `time=0`, `level=50`, `msg="boom"`, `file="a"`).
    """
    doc: dict[str, Any] = {
        "level": 30,
        "time": int(time.time() * 1000),
        "pid": 4242,
        "hostname": "web-1.example.internal",
        "reqId": f"req-{seq:08x}",
        "req": {
            "method": _METHODS[seq % len(_METHODS)],
            "url": f"{_ROUTES[seq % len(_ROUTES)]}/{seq * 7919 % 100000}?page={seq % 13}",
            "remoteAddress": f"10.0.{seq % 256}.{(seq * 31) % 256}",
            "userAgent": "Mozilla/5.0 (X11; Linux x86_64) node-fetch/3.3",
        },
        "res": {"statusCode": _STATUS[seq % len(_STATUS)]},
        "responseTime": round(1.5 + (seq * 37 % 2000) / 10, 1),
        "msg": _MESSAGES[seq % len(_MESSAGES)],
        "seq": seq,
    }
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def line_offsets(path: str | os.PathLike[str]) -> dict[int, int]:
    """seq -> byte offset of its line in the file (pino lines with a `seq`)."""
    out, pos = {}, 0
    with open(path, "rb") as f:
        data = f.read()
    for raw in data.splitlines(keepends=True):
        out[json.loads(raw)["seq"]] = pos
        pos += len(raw)
    return out


def append_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> None:
    """Append `data` with one O_APPEND open/write/close (creates the file, mode 0644)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    promptness.note_written(data)


def write_lines(
    path: str | os.PathLike[str],
    seqs: Iterable[int],
    *,
    fsync: bool = False,
    line_fn: Callable[[int], bytes] = pino_line,
) -> int:
    """Append one `line_fn(seq)` per seq with O_APPEND; returns the bytes written."""
    data = b"".join(line_fn(s) for s in seqs)
    append_bytes(path, data, fsync=fsync)
    return len(data)


class Writer:
    """A background thread appending pino lines to `path` at `rate` lines per second.

    By default each batch is open(O_APPEND)-write-close, so a rename rotation is followed at
    the next batch, like an app that reopens its log. With `keep_open=True` the fd stays open
    until `reopen()` (an app that reopens only on SIGHUP); with `o_append=False` as well, it
    writes at its own offset, leaving the NUL hole that copytruncate produces for such apps.
    `written` lists the seqs whose bytes were fully written, in order.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rate: float = 500.0,
        start_seq: int = 0,
        max_lines: int | None = None,
        batch_interval_s: float = 0.02,
        keep_open: bool = False,
        o_append: bool = True,
        line_fn: Callable[[int], bytes] = pino_line,
    ) -> None:
        self.path = Path(path)
        self.rate = rate
        self.max_lines = max_lines
        self._next_seq = start_seq
        self._interval_s = batch_interval_s
        self._keep_open = keep_open
        self._o_append = o_append
        self._line_fn = line_fn
        self._lock = threading.Lock()
        self._written: list[int] = []
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._idle = threading.Event()        # set while paused, between batches
        self._reopen = threading.Event()
        self._fd: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"writer-{self.path.name}", daemon=True)

    # ------------------------------------------------------------------ control

    def start(self) -> Writer:
        self._thread.start()
        return self

    def pause(self, timeout_s: float = 10.0) -> None:
        """Stop writing after the current batch and return once it is written (the fd, if kept
        open, stays open): nothing is written from then until `resume()`."""
        self._running.clear()
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and not self._idle.wait(0.05):
            if time.monotonic() > deadline:
                raise AssertionError(f"writer for {self.path} did not pause within {timeout_s}s")

    def resume(self) -> None:
        self._running.set()

    def reopen(self) -> None:
        """With keep_open: close and reopen by path before the next batch (like SIGHUP)."""
        self._reopen.set()

    def stop(self, timeout_s: float = 10.0) -> list[int]:
        """Stop the thread, close the fd, re-raise any error from the thread; returns `written`."""
        self._stop.set()
        self._running.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise AssertionError(f"writer for {self.path} did not stop within {timeout_s}s")
        if self._error is not None:
            raise AssertionError(f"writer for {self.path} failed: {self._error!r}") from self._error
        return self.written

    def __enter__(self) -> Writer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state

    @property
    def written(self) -> list[int]:
        with self._lock:
            return list(self._written)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._written)

    @property
    def is_done(self) -> bool:
        """True once max_lines were written (or the thread ended)."""
        return not self._thread.is_alive() and self._thread.ident is not None

    # ------------------------------------------------------------------ the thread

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self._o_append else 0)
        fd = os.open(self.path, flags, 0o644)
        if not self._o_append:
            os.lseek(fd, 0, os.SEEK_END)
        return fd

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write_batch(self, seqs: list[int]) -> None:
        data = b"".join(self._line_fn(s) for s in seqs)
        if self._keep_open:
            if self._reopen.is_set():
                self._reopen.clear()
                self._close()
            if self._fd is None:
                self._fd = self._open()
            fd = self._fd
        else:
            fd = self._open()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            if not self._keep_open:
                os.close(fd)
        promptness.note_written(data)
        with self._lock:
            self._written.extend(seqs)

    def _run(self) -> None:
        # Pacing: lines due = rate * running time; a paused interval does not accumulate debt.
        try:
            budget = 0.0
            last = time.monotonic()
            while not self._stop.is_set():
                if not self._running.is_set():
                    self._idle.set()
                    self._running.wait()
                    self._idle.clear()
                    last = time.monotonic()
                    continue
                now = time.monotonic()
                budget += (now - last) * self.rate
                last = now
                n = int(budget)
                if self.max_lines is not None:
                    n = min(n, self.max_lines - self.count)
                if n > 0:
                    budget -= n
                    seqs = list(range(self._next_seq, self._next_seq + n))
                    self._next_seq += n
                    self._write_batch(seqs)
                if self.max_lines is not None and self.count >= self.max_lines:
                    return
                self._stop.wait(self._interval_s)
        except BaseException as e:  # reported by stop()
            self._error = e
        finally:
            self._close()
