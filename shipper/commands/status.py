"""`shipper status`: per-file progress, queue depth, dead letters and output state.

Works while the daemon runs (it reads the status file the daemon refreshes every 2 s) and when it
is stopped (it reads the spool's checkpoints directly).
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

import orjson

from shipper.config import load_config
from shipper.service import STATUS_FILE
from shipper.spool import Spool


def daemon_running(state_dir: str) -> bool:
    path = os.path.join(state_dir, "lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read_status_file(state_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(state_dir, STATUS_FILE), "rb") as f:
            v = orjson.loads(f.read())
            return v if isinstance(v, dict) else None
    except (OSError, orjson.JSONDecodeError):
        return None


def collect(state_dir: str) -> dict[str, Any]:
    running = daemon_running(state_dir)
    last = _read_status_file(state_dir) or {}
    out: dict[str, Any] = {"running": running, "files": [], "queue": {"events": 0, "bytes": 0},
                           "dead_letter": 0, "output": {"up": None, "last_error": None}}
    out["output"]["up"] = last.get("output", {}).get("up") if running else None
    out["output"]["last_error"] = last.get("output", {}).get("last_error")
    if not os.path.isdir(os.path.join(state_dir, "spool")):
        return out
    spool = Spool(state_dir, read_only=True)
    try:
        shipped = spool.shipped_offsets()
        files = []
        for inc, cp in spool.checkpoints.items():
            size = None
            try:
                st = os.stat(cp.path)
                if st.st_ino == cp.inode and st.st_dev == cp.dev:
                    size = st.st_size
            except OSError:
                pass
            if cp.finished and size is None:
                continue
            if size is None:
                size = cp.size
            off = shipped.get(inc, cp.offset)
            files.append({"path": cp.path, "inode": cp.inode, "incarnation": inc, "offset": off,
                          "queued_offset": cp.offset, "size": size, "lag_bytes": max(0, size - off),
                          "finished": cp.finished, "updated": cp.updated})
        files.sort(key=lambda f: (f["path"], -f["updated"]))
        out["files"] = files
        out["queue"] = {"events": spool.queued_events, "bytes": spool.queued_bytes}
        out["dead_letter"] = spool.dead_letters
    finally:
        spool.close()
    return out


def _bar(done: int, total: int, width: int = 20) -> str:
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    n = int(frac * width)
    return "[" + "#" * n + "-" * (width - n) + f"] {frac * 100:5.1f}%"


def status(config_path: str, as_json: bool = False) -> int:
    cfg = load_config(config_path)
    doc = collect(cfg.state_dir)
    if as_json:
        print(orjson.dumps(doc).decode())
        return 0
    print(f"daemon: {'running' if doc['running'] else 'stopped'}   state_dir: {cfg.state_dir}")
    out = doc["output"]
    up = "up" if out["up"] else ("down" if out["up"] is False else "unknown (daemon stopped)")
    print(f"output: {up}" + (f"   last error: {out['last_error']}" if out["last_error"] else ""))
    print(f"queue: {doc['queue']['events']} events, {doc['queue']['bytes']} bytes   dead letters: {doc['dead_letter']}")
    if not doc["files"]:
        print("files: none tracked yet")
    for f in doc["files"]:
        print(f"{f['path']}  inode {f['inode']}  {_bar(f['offset'], f['size'])}  "
              f"{f['offset']}/{f['size']} bytes  lag {f['lag_bytes']}")

    return 0
