"""A compressed copy still being written is not a file no one saw (logrotate `compress`).

logrotate renames app.log to app.log.1, creates a new app.log, then gzip writes app.log.1.gz over
time. The new incarnation at a known path makes shipper look among the rotated siblings for files
written while it did not look (successors). A look while gzip had not yet put out its first block
found a .gz with no first bytes, matched it to no known incarnation, and read it from 0 under a new
incarnation: every line of the rotated file twice (seen in CI: 300 lines, test_rotation's
kill -9 test in compress mode). Real files and real gzip streams; the look runs off the loop as
in the daemon.
"""

from __future__ import annotations

import asyncio
import gzip
import os
from pathlib import Path

from shipper.model import Checkpoint
from shipper.tail import identity
from shipper.tail.catalog import Catalog
from shipper.tail.fileset import FileSet
from shipper.tail.recovery import Recovery
from tests.support.fake_clock import RecordingEvents
from tests.support.writer import pino_line


def _known(log: Path, content: bytes) -> tuple[FileSet, Recovery]:
    """`content` at `log`, a known incarnation read to its end, and the recovery that knows it."""
    log.write_bytes(content)
    st = log.stat()
    fp_len, fp = identity.fingerprint_head(content[:identity.FP_MAX_BYTES])
    cp = Checkpoint("aaaaaaaaaaaa", str(log), st.st_dev, st.st_ino, fp_len, fp, len(content), len(content), 1.0)
    files = FileSet(10, RecordingEvents())
    return files, Recovery(Catalog([cp]), files, RecordingEvents(), lambda c: None, lambda p: 0)


def test_a_gz_gzip_is_still_writing_is_looked_at_again_and_then_known_as_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    content = b"".join(pino_line(i) for i in range(300))
    files, recovery = _known(log, content)       # the rotated incarnation (the daemon held it open, renamed)
    os.rename(log, tmp_path / "app.log.1")
    log.write_bytes(b"")                                     # the new app.log
    whole = gzip.compress(content)
    gz = tmp_path / "app.log.1.gz"
    for written in (b"", whole[:10], whole[:40]):            # gzip under way: no first bytes yet
        gz.write_bytes(written)
        recovery.lost_sight_of(str(log), 0)
        asyncio.run(recovery.find_successors({}))
        assert not files.waiting, f"{len(written)} bytes of the .gz taken as a file no one saw"
        assert recovery.wants_successors                     # looked at again after the next rescan
    gz.write_bytes(whole)                                    # gzip done: the copy of the known incarnation
    asyncio.run(recovery.find_successors({}))
    assert not files.waiting and not recovery.wants_successors


def test_a_gz_no_known_incarnation_wrote_is_still_a_successor(tmp_path: Path) -> None:
    """What the look is for: a file created and rotated away while shipper did not look."""
    log = tmp_path / "app.log"
    files, recovery = _known(log, b"".join(pino_line(i) for i in range(50)))
    unseen = b"".join(pino_line(i, msg="written while we did not look") for i in range(1000, 1300))
    (tmp_path / "app.log.1.gz").write_bytes(gzip.compress(unseen))
    recovery.lost_sight_of(str(log), 0)
    asyncio.run(recovery.find_successors({}))
    assert [c.path for c in files.waiting.values()] == [str(tmp_path / "app.log.1.gz")]
