"""Log rotation on real files, step for step what logrotate 3.x does, plus the real logrotate.

The helpers follow the system calls logrotate 3.21 makes (checked with strace):
  create:        shift .i -> .i+1 (oldest first), rename path -> path.1, create path
                 (O_EXCL, the old file's mode and owner), unlink path.(rotate+1)
  copytruncate:  shift, copy path -> path.1, then ftruncate(path, 0) -- copy first, so lines
                 written between the two steps are in no file (logrotate's own loss window)
  compress:      after the above, gzip path.1 -> path.1.gz and unlink path.1
  delaycompress: *before* shifting, gzip the previous path.1 -> path.1.gz; after shifting it
                 is path.2.gz and path.1 stays plain until the next rotation
The test suite compares these helpers with the real binary (tests/component/test_support_rotate.py).
"""

from __future__ import annotations

import grp
import gzip
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

LOGROTATE = "/usr/sbin/logrotate"


def _rotated(path: Path, i: int, gz: bool) -> Path:
    return path.with_name(f"{path.name}.{i}{'.gz' if gz else ''}")


def gzip_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """gzip `src` into a new file `dst` (O_EXCL, src's mode), then unlink `src`, like logrotate."""
    src, dst = Path(src), Path(dst)
    mode = stat.S_IMODE(src.stat().st_mode)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6) as gz, open(src, "rb") as f:
        shutil.copyfileobj(f, gz)
    os.chmod(dst, mode)
    os.unlink(src)


def _create_like(path: Path, st: os.stat_result) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        # a writer that opens with O_CREAT per write re-created the path between the rename and
        # here: its file stands (logrotate keeps an existing file too, it only warns)
        return
    try:
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
        if os.geteuid() == 0 or st.st_uid == os.geteuid():
            try:
                os.fchown(fd, st.st_uid, st.st_gid)
            except PermissionError:
                pass
    finally:
        os.close(fd)


def rotate(
    path: str | os.PathLike[str],
    *,
    mode: Literal["create", "copytruncate"] = "create",
    keep: int = 5,
    compress: bool = False,
    delaycompress: bool = False,
    create: bool = True,
    after_copy: Callable[[], None] | None = None,
    compressor: Callable[[Path, Path], None] = gzip_file,
) -> None:
    """One forced rotation of `path` as logrotate does it with `rotate keep` and these options.

    `create=False` is logrotate's `nocreate` (only for mode create). `after_copy` runs between
    copytruncate's copy and its truncate (to write into logrotate's loss window). `compressor(src,
    dst)` does gzip's part (default `gzip_file`; a test may do it step by step later).
    """
    if keep < 1:
        raise ValueError("keep must be at least 1")
    p = Path(path)
    st = p.stat()
    if compress and delaycompress:
        prev = _rotated(p, 1, gz=False)
        if prev.exists():
            compressor(prev, _rotated(p, 1, gz=True))
    # Shift oldest first; the one shifted past `keep` is unlinked only at the end, as logrotate does.
    for i in range(keep, 0, -1):
        src = _rotated(p, i, gz=compress)
        if src.exists():
            os.rename(src, _rotated(p, i + 1, gz=compress))
    first = _rotated(p, 1, gz=False)
    if mode == "copytruncate":
        fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as out, open(p, "rb") as src_f:
            shutil.copyfileobj(src_f, out)
        os.chmod(first, stat.S_IMODE(st.st_mode))
        if after_copy is not None:
            after_copy()
        os.truncate(p, 0)
    elif mode == "create":
        os.rename(p, first)
        if create:
            _create_like(p, st)
    else:
        raise ValueError(f"unknown rotation mode {mode!r}")
    if compress and not delaycompress:
        compressor(first, _rotated(p, 1, gz=True))
    excess = _rotated(p, keep + 1, gz=compress)
    if excess.exists():
        os.unlink(excess)


def rotate_rename(path: str | os.PathLike[str], keep: int = 5) -> None:
    """logrotate `create`: path -> path.1 (older ones shifted), new empty path with the same mode."""
    rotate(path, mode="create", keep=keep)


def rotate_copytruncate(
    path: str | os.PathLike[str], keep: int = 5, *, after_copy: Callable[[], None] | None = None
) -> None:
    """logrotate `copytruncate`: copy path -> path.1, then truncate path to 0 (in that order)."""
    rotate(path, mode="copytruncate", keep=keep, after_copy=after_copy)


def rotate_delaycompress(path: str | os.PathLike[str], keep: int = 5) -> None:
    """logrotate `create compress delaycompress`: old path.1 becomes path.2.gz, path -> path.1, new path."""
    rotate(path, mode="create", keep=keep, compress=True, delaycompress=True)


def rotate_compress(path: str | os.PathLike[str], keep: int = 5) -> None:
    """logrotate `create compress`: path -> path.1, new path, then path.1 -> path.1.gz at once."""
    rotate(path, mode="create", keep=keep, compress=True)


def logrotate_conf(
    path_glob: str | os.PathLike[str],
    mode: Literal["create", "copytruncate"] = "create",
    *,
    compress: bool = False,
    delaycompress: bool = False,
    rotate: int = 5,
    extra: Sequence[str] | str = (),
) -> str:
    """A logrotate config stanza that the real binary accepts for a test's tmp dir.

    `su` names the current user and group: without it logrotate refuses a log whose directory is
    group- or world-writable ("parent directory has insecure permissions"). `missingok` keeps
    an unmatched glob from failing the run. `extra` lines go into the stanza as they are.
    """
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    lines = [f"su {user} {group}", f"rotate {rotate}", mode, "missingok"]
    if compress:
        lines.append("compress")
    if delaycompress:
        lines.append("delaycompress")
    lines.extend([extra] if isinstance(extra, str) else extra)
    body = "".join(f"    {line}\n" for line in lines)
    return f"{os.fspath(path_glob)} {{\n{body}}}\n"


class LogrotateError(RuntimeError):
    pass


def run_logrotate(
    conf: str | os.PathLike[str], state_file: str | os.PathLike[str], *, force: bool = True, timeout_s: float = 30.0
) -> str:
    """Run the real `/usr/sbin/logrotate [-f] -s STATE CONF`; returns its stderr.

    `conf` is config text (written beside the state file) or a path to a config file. The
    config must be mode 0644 and owned by us: logrotate *ignores* a group/world-writable or
    foreign-owned config with exit status 0, so any `error:` on stderr raises too.
    """
    state = Path(state_file)
    if isinstance(conf, str) and ("{" in conf or "\n" in conf):
        conf_path = state.with_name(state.name + ".conf")
        conf_path.write_text(conf)
    else:
        conf_path = Path(conf)
    os.chmod(conf_path, 0o644)
    argv = [LOGROTATE, *(["-f"] if force else []), "-s", os.fspath(state), os.fspath(conf_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0 or "error:" in proc.stderr:
        raise LogrotateError(
            f"logrotate failed (exit {proc.returncode}): {' '.join(argv)}\n{proc.stderr}\n--- config:\n{conf_path.read_text()}"
        )
    return proc.stderr
