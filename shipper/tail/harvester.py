"""One harvester per open file: the fd, the read position and the rotation state machine; bounded
chunks in, complete lines out (LineSplitter); never parses, batches or sends. Rotation, truncation,
deletion, .gz copies (read through gzip with the original's offsets) and sparse holes handled here."""

from __future__ import annotations

import errno
import gzip
import os
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Literal

from shipper.model import Checkpoint, Line, SplitBuild
from shipper.tail import identity
from shipper.tail.lines import Built, LineSplitter

State = Literal["active", "renamed", "deleted", "closed"]
Change = Literal["grown", "same", "truncated", "renamed", "deleted", "touched"]

CHUNK_BYTES = 1024 * 1024
TAIL_BYTES = 32          # the last bytes read, checked again to tell a copytruncate from growth

# Reads land in one buffer per thread, reused from read to read (the lines are copied out of it
# before `read` returns). A new bytes object per read meant fresh memory for every 256 KiB read,
# which the kernel's copy into it pays for (docs/development.md).
_buffers = threading.local()


def _read_buffer(n: int) -> memoryview:
    buf: bytearray | None = getattr(_buffers, "buf", None)
    if buf is None or len(buf) < n:
        buf = _buffers.buf = bytearray(max(n, CHUNK_BYTES + TAIL_BYTES))
    return memoryview(buf)[:n]


class Harvester:
    """Reads one file (or a rotated copy of it) for one incarnation.

    The checkpoint is read here, never changed: the file source owns it (offset, fingerprint). `path` is where the file was opened
    (for stat checks and logs); the checkpoint's path is the one its documents carry.

    Rename rotation: the old fd is read to its end while the path gets a new harvester.
    Truncation (size below our position, or the bytes we read are no longer there): a new
    incarnation from 0. A deleted file that is still open is read to its end before it is
    closed. Holes of a sparse file are skipped (SEEK_DATA), never read; a hole up to the file's
    end is not consumed either: reading waits there for data (a writer filling a preallocated
    file).
    """

    def __init__(self, path: str, fd: int, st: os.stat_result, checkpoint: Checkpoint,
                 max_line_bytes: int, now: float, *, start_offset: int | None = None,
                 gz: GzipReader | None = None, size_hint: int | None = None) -> None:
        self.path = path
        self.fd = fd
        self.dev = st.st_dev
        self.inode = st.st_ino
        self.size = st.st_size if gz is None else max(size_hint or 0, 0)
        self.mtime_ns = st.st_mtime_ns
        self.checkpoint = checkpoint
        start = checkpoint.offset if start_offset is None else start_offset
        self.splitter = LineSplitter(start, max_line_bytes)
        self.state: State = "active"
        self.last_growth = now      # monotonic time the file last grew (or was opened)
        self.at_eof = False
        self.truncations = 0
        self.error: str | None = None   # a compressed copy that could not be read (yet)
        self.suspect = False            # the bytes before our position changed: a truncation
        self.hole_at: int | None = None  # the position, when the file holds no data from there to its end
        self._gz = gz
        self._tail = b""

    # ------------------------------------------------------------------ reading

    @property
    def position(self) -> int:
        return self.splitter.read_position

    @property
    def compressed(self) -> bool:
        return self._gz is not None

    @property
    def needs_seek(self) -> bool:
        """A compressed copy whose decompressor is not at the read position yet."""
        gz = self._gz
        return gz is not None and self.error is None and gz.tell() != self.splitter.read_position

    @property
    def data_end(self) -> int:
        """Where the file's data ends as last seen: its size, or where a hole up to its end begins."""
        hole = self.hole_at
        return self.size if hole is None else min(hole, self.size)

    @property
    def lag_bytes(self) -> int:
        return max(0, self.data_end - self.checkpoint.offset)

    def read(self, max_bytes: int = CHUNK_BYTES) -> list[Line]:
        """Read up to max_bytes from the current position; [] at EOF (at_eof is then set)."""
        chunk = self._chunk(max_bytes)
        return [] if chunk is None else self.splitter.feed(chunk)   # feed copies what it keeps

    def read_built(self, max_bytes: int, make_split: Callable[[], SplitBuild]) -> tuple[list[Line], Built]:
        """`read`, with the complete lines built as they are split (LineSplitter.feed_built) by the
        builder `make_split` binds, asked for only when there are bytes: (the lines still to build,
        what was built)."""
        chunk = self._chunk(max_bytes)
        return ([], Built()) if chunk is None else self.splitter.feed_built(chunk, make_split())

    def _chunk(self, max_bytes: int) -> bytes | memoryview | None:
        """The next bytes to split (a view of this thread's read buffer), or None at EOF."""
        pos = self.splitter.read_position
        if self.suspect:
            self.at_eof = True
            return None
        chunk: bytes | memoryview
        if self._gz is not None:
            if self.error is not None:
                self.at_eof = True
                return None
            chunk = self._read_gz(pos, max_bytes)
        else:
            if self.hole_at == pos:
                # no data from here to the end when last read: ask again before reading a byte
                nxt = self._next_data(pos)
                if nxt < 0:
                    self.at_eof = True
                    return None
                self.hole_at = None
                if nxt > pos:
                    self._skip(pos, nxt)
                    pos = nxt
            # Read the last bytes we read once more in front of the new ones: if they are not the
            # same, the file was truncated and written again (copytruncate, a NUL hole) and what
            # follows belongs to a new incarnation. Told by content, before anything is consumed.
            k = len(self._tail)
            buf = _read_buffer(max_bytes + k)
            try:
                data = buf[:os.preadv(self.fd, [buf], pos - k)]
            except OSError as e:
                if e.errno in (errno.EIO, errno.ESTALE):
                    self.at_eof = True
                    return None
                raise
            if k and data[:k] != self._tail:
                self.suspect = True
                self.at_eof = True
                return None
            chunk = data[k:] if k else data
            cp = self.checkpoint
            if chunk and pos < cp.fp_len and not _holds(self.fd, cp.fp_len, cp.fp):
                # reading inside the bytes the incarnation was fingerprinted over, and they are
                # not there: truncated and written again before we read them (copytruncate twice
                # in quick succession). Those bytes are in a copy now; these belong to a new
                # incarnation. Without this, the new bytes were read under the old identity and
                # the copy found by the fingerprint then skipped as read (lost + duplicated).
                self.suspect = True
                self.at_eof = True
                return None
            if chunk and self.at_eof and pos > 0:
                # new bytes after a pause: the writer may have truncated and refilled the file with
                # lines shaped like ours (the last bytes can match by chance); the head cannot
                cp = self.checkpoint
                if cp.fp_len and not _holds(self.fd, cp.fp_len, cp.fp):
                    self.suspect = True
                    return None
            if chunk and chunk[0] == 0 and chunk[-1] == 0 and not self.splitter.pending_bytes:
                # all NULs, maybe a hole of a sparse file (reading one costs CPU for nothing): where
                # its data goes on is asked, not read; a line begun before it reads the NULs as
                # its bytes until it is cut (at most max_line_bytes), then skips the rest
                nxt = self._next_data(pos)
                if nxt < 0:
                    self.hole_at = pos
                    self.at_eof = True
                    return None
                if nxt >= pos + len(chunk):
                    self._skip(pos, nxt)
                    return self._chunk(max_bytes)
            elif chunk and chunk[-1] == 0:
                # data, then NULs: where a hole begins, the chunk ends (read no further into it)
                end = self._hole_after(pos, len(chunk))
                if end < len(chunk):
                    chunk = chunk[:end]
                    self._tail = bytes(chunk[-TAIL_BYTES:]) if end >= TAIL_BYTES else (self._tail + chunk)[-TAIL_BYTES:]
                    if pos + end > self.size:
                        self.size = pos + end
                    self.at_eof = False             # what follows the hole is asked for next time
                    return chunk
        if not chunk:
            self.at_eof = True
            if self._gz is not None and self.error is None:
                self.size = pos         # a compressed copy's real size is known at its end
            return None
        self.at_eof = len(chunk) < max_bytes
        if pos + len(chunk) > self.size:
            self.size = pos + len(chunk)
        n = len(chunk)
        self._tail = bytes(chunk[-TAIL_BYTES:]) if n >= TAIL_BYTES else (self._tail + chunk)[-TAIL_BYTES:]
        return chunk

    def _next_data(self, pos: int) -> int:
        """Where the file's data goes on from `pos` (SEEK_DATA: holes are skipped, not read); -1
        when it holds none from `pos` to its end (such a hole is not consumed: `hole_at`)."""
        try:
            return os.lseek(self.fd, pos, os.SEEK_DATA)
        except OSError as e:
            return -1 if e.errno == errno.ENXIO else pos   # no SEEK_DATA here: the NULs are read

    def _hole_after(self, pos: int, n: int) -> int:
        """How many of the n bytes from `pos` come before the next hole (SEEK_HOLE; n when none)."""
        try:
            return max(0, min(n, os.lseek(self.fd, pos, os.SEEK_HOLE) - pos)) or n
        except OSError:
            return n

    def _skip(self, pos: int, nxt: int) -> None:
        """Move past the hole [pos, nxt) as the splitter would past its NULs, without reading them."""
        self.splitter.skip_zeros(nxt - pos)
        self._tail = bytes(min(TAIL_BYTES, nxt))

    def seek_compressed(self) -> None:
        """Bring a compressed copy's decompressor to the read position, decompressing all before
        it: seconds for a large .gz read from far in, so the pipeline calls this in a thread and
        the reads on the event loop stay bounded. A failure is kept in `error` (retried later)."""
        gz = self._gz
        if gz is None or self.error is not None:
            return
        try:
            pos = self.splitter.read_position
            if gz.tell() != pos:
                gz.seek(pos)
        except (EOFError, OSError, ValueError, zlib.error) as e:
            self.error = f"{type(e).__name__}: {e}"

    def _read_gz(self, pos: int, max_bytes: int) -> bytes:
        gz = self._gz
        assert gz is not None
        try:
            if gz.tell() != pos:
                gz.seek(pos)        # forward: decompresses and discards up to the recorded offset
            return gz.read(max_bytes)
        except (EOFError, OSError, zlib.error) as e:
            # e.g. logrotate is still writing this .gz: the pipeline retries it later
            self.error = f"{type(e).__name__}: {e}"
            return b""

    def flush_partial(self) -> list[Line]:
        """The file will not grow any more: its last line without newline counts as a line."""
        return self.splitter.flush()

    # ------------------------------------------------------------------ state checks

    def _content_holds(self) -> bool:
        """Are the bytes we fingerprinted and the last bytes we read still where they were?

        A copytruncate followed at once by new writes (or by a writer without O_APPEND that leaves
        a NUL hole up to its old offset) need not shrink the file below our position: the content
        tells, not the size.
        """
        cp = self.checkpoint
        if cp.fp_len and not _holds(self.fd, cp.fp_len, cp.fp):
            return False
        tail = self._tail
        if tail and tail.strip(b"\x00"):
            pos = self.splitter.read_position
            try:
                if pos >= len(tail) and os.pread(self.fd, len(tail), pos - len(tail)) != tail:
                    return False
            except OSError:
                return True     # unreadable now (EIO, ESTALE): no evidence of a truncation
        return True

    def check(self, now: float, at: Mapping[str, tuple[int, int]] | None = None) -> Change:
        """fstat the fd and stat the path; decide what happened since the last look. `at` (a
        rescan's path -> (dev, inode), taken a moment ago) stands in for the stat of a path it has."""
        if self.fd < 0 or self._gz is not None:
            return "same"            # a compressed copy never changes
        try:
            fst = os.fstat(self.fd)
        except OSError:
            self.state = "deleted"
            return "deleted"
        size = fst.st_size
        pos = self.splitter.read_position
        if size < pos or self.suspect:
            return "truncated"
        if size != self.size or fst.st_mtime_ns != self.mtime_ns:
            if size > self.size:
                self.last_growth = now
            self.size = size
            self.mtime_ns = fst.st_mtime_ns
            if not self._content_holds():
                return "truncated"
            if size == 0 and pos == 0:
                # written and emptied again before we read a byte (copytruncate of a file we had
                # not read yet): no content to compare, but the copy beside it holds what was there
                return "touched"
        if fst.st_nlink == 0:
            if self.state != "deleted":
                self.state = "deleted"
                return "deleted"
            return "grown" if size > pos else "same"
        if self.state != "active":
            return "grown" if size > pos else "same"
        found = at.get(self.path) if at is not None else None
        if found is not None:
            if found != (self.dev, self.inode):
                self.state = "renamed"
                return "renamed"
            return "grown" if size > pos else "same"
        try:
            pst = os.stat(self.path)
        except FileNotFoundError:
            self.state = "renamed"     # moved away or unlinked-with-other-links: read to the end
            return "renamed"
        except OSError:
            return "same"
        if pst.st_ino != self.inode or pst.st_dev != self.dev:
            self.state = "renamed"
            return "renamed"
        return "grown" if size > pos else "same"

    def restart_at_zero(self, new_checkpoint: Checkpoint) -> None:
        """A truncation: continue as a new incarnation from offset 0 of the same fd."""
        self.checkpoint = new_checkpoint
        self.splitter = LineSplitter(0, self.splitter.max_line_bytes)
        self.truncations += 1
        self._tail = b""
        self.hole_at = None
        self.suspect = False
        self.at_eof = False
        try:
            fst = os.fstat(self.fd)
            self.size, self.mtime_ns = fst.st_size, fst.st_mtime_ns
        except OSError:
            self.size = 0

    def grown_fingerprint(self) -> tuple[int, str] | None:
        """A longer fingerprint, when the file grew past a short one (tiny files are shipped at
        once, so their fingerprint grows with them); None when it stays as it is. The caller, who
        owns the checkpoint, records it."""
        cp = self.checkpoint
        if self._gz is not None or cp.fp_len >= identity.FP_MAX_BYTES or self.size <= cp.fp_len:
            return None
        try:
            fp_len, fp = identity.fingerprint_fd(self.fd, self.size)
        except OSError:
            return None
        return (fp_len, fp) if fp_len > cp.fp_len else None

    def close(self) -> None:
        if self._gz is not None:
            try:
                self._gz.close()
            except (OSError, EOFError, zlib.error):
                pass
            self._gz = None
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
        self.state = "closed"


def _holds(fd: int, fp_len: int, fp: str) -> bool:
    """identity.matches, where a read error (EIO, ESTALE) is no evidence that the content changed:
    calling it a truncation would re-read the file as a new incarnation (duplicates)."""
    try:
        return identity.matches(fd, fp_len, fp)
    except OSError:
        return True


class GzipReader:
    """Sequential reads of a gzip file opened from an fd (dup'ed: the harvester keeps its own)."""

    def __init__(self, fd: int) -> None:
        self._raw = os.fdopen(os.dup(fd), "rb")
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="rb")

    def tell(self) -> int:
        return self._gz.tell()

    def seek(self, pos: int) -> int:
        return self._gz.seek(pos)

    def read(self, n: int) -> bytes:
        return self._gz.read(n)

    def close(self) -> None:
        try:
            self._gz.close()
        finally:
            self._raw.close()
