"""`shipper status`: per-file progress, queue depth, dead letters, output state and rates. A running
daemon (or pipe) is asked over GET /status, else its status.json is read; a stopped one's spool is
read read-only. `render` (pure) draws the table."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
import urllib.error
import urllib.request
from typing import Any

import orjson

from shipper import __version__, settings, statedir
from shipper.clock import SystemClock
from shipper.config import Config, MetricsConfig
from shipper.model import is_journal_checkpoint
from shipper.service import STATUS_FILE
from shipper.ship.client import redact_url
from shipper.sources.journald.cursor import journal_key, status_entry
from shipper.sources.journald.probe import JOURNALCTL, read_head_sync
from shipper.spool import SpoolContents
from shipper.spool.stopped import read_stopped

STATUS_FRESH_S = 10.0      # a status.json older than this is not trusted as the live state
ASK_TIMEOUT_S = 2.0
STATUS_MAX_BYTES = 256 << 20   # far above what a daemon with 100,000 files writes (docs/development.md)


def daemon_running(state_dir: str) -> bool:
    path = os.path.join(state_dir, "lock")
    try:
        fd = statedir.open_file(path, os.O_RDONLY)       # no link followed
    except (OSError, statedir.UnsafeStateDir):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read_status_file(state_dir: str) -> dict[str, Any] | None:
    path = os.path.join(state_dir, STATUS_FILE)
    try:
        fd = statedir.open_file(path, os.O_RDONLY)       # no link followed, a regular file only
    except (OSError, statedir.UnsafeStateDir):
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            v = orjson.loads(f.read(STATUS_MAX_BYTES))
            mtime = os.fstat(f.fileno()).st_mtime
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(v, dict):
        return None
    try:
        written = float(v.get("updated") or 0)
    except (TypeError, ValueError):
        written = 0.0
    if mtime > written:
        # the daemon vouches for an unchanged status by moving the file's mtime (service.vouch_status)
        v["updated"] = round(mtime, 3)
    return v


def _ask_daemon(listen: str | None) -> dict[str, Any] | None:
    """GET /status from the running daemon; None when metrics are off or nothing answers."""
    if not listen:
        return None
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "[::]":
        host = "[::1]"                # listening on every IPv6 address: ask over IPv6 loopback
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=ASK_TIMEOUT_S) as resp:
            v = orjson.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return v if isinstance(v, dict) else None


def _at_path(cp: Any) -> bool:
    try:
        st = os.stat(cp.path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (cp.dev, cp.inode)


def _stopped_files(spool: SpoolContents) -> list[dict[str, Any]]:
    shipped = spool.shipped_offsets()
    files: list[dict[str, Any]] = []
    for cp in spool.checkpoints:
        inc = cp.incarnation
        if is_journal_checkpoint(cp):
            continue               # shown in `journald`
        if cp.finished:
            # read to its end (rotated away, deleted, or truncated by copytruncate: the file now at
            # its inode is the next incarnation's): nothing left to read; what it queued is the queue's
            continue
        size = None
        try:
            st = os.stat(cp.path)
            if st.st_ino == cp.inode and st.st_dev == cp.dev:
                size = st.st_size
        except OSError:
            pass
        if size is None:
            size = cp.size
        off = shipped.get(inc, cp.offset)
        moved = not _at_path(cp)
        files.append({"path": cp.path, "inode": cp.inode, "incarnation": inc, "offset": off,
                      "queued_offset": cp.offset, "size": size, "lag_bytes": max(0, size - off),
                      "state": "rotated" if moved else "stopped",
                      "updated": cp.updated, "rate_bytes_per_s": None, "eta_s": None})
    files.sort(key=_newest_first)
    return files


def _newest_first(row: dict[str, Any]) -> tuple[str, float]:
    updated: Any = row["updated"]
    return str(row["path"]), -float(updated)


def _stopped_journald(cfg: Config, spool: SpoolContents | None) -> list[dict[str, Any]]:
    """Each journald input with the cursor its checkpoint holds, and its lag from the journal's
    newest matching entry (journalctl asked now); stored inputs no longer configured too."""
    shipped = spool.shipped_offsets() if spool is not None else {}
    cps = {cp.incarnation: cp for cp in spool.checkpoints if is_journal_checkpoint(cp)} if spool else {}
    out = []
    for inp in cfg.inputs:
        if inp.journald is None:
            continue
        j = inp.journald
        cp = cps.pop(journal_key(j.directory, j.units), None)
        head = read_head_sync(JOURNALCTL, j.directory, j.units)
        cursor = cp.cursor if cp is not None else None
        out.append(status_entry(j.directory, j.units, cursor, head,
                                shipped.get(cp.incarnation) if cp is not None else None))
    for cp in cps.values():
        directory = cp.path.removeprefix("journald:")
        out.append({"directory": None if directory == "system" else directory, "units": [], "cursor": cp.cursor,
                    "lag_entries": None, "lag_seconds": None, "key": cp.incarnation, "configured": False})
    return out


def collect(cfg: Config, now: float) -> dict[str, Any]:
    """The status document: live from the daemon when it runs, from the state_dir when it does not
    (`now`: wall time, to judge how fresh the daemon's last status.json is)."""
    state_dir = cfg.state_dir
    running = daemon_running(state_dir)
    last = _read_status_file(state_dir) or {}
    if running:
        live = _ask_daemon(cfg.metrics.listen)
        source = "daemon"
        if live is None and last and now - float(last.get("updated") or 0) <= STATUS_FRESH_S:
            live, source = last, "status.json"
        if live is not None:
            live["running"], live["daemon"], live["source"] = True, "running", source
            return live
    got = last.get("output")
    last_out: dict[str, Any] = got if isinstance(got, dict) else {}
    out: dict[str, Any] = {
        "daemon": "running" if running else "stopped", "running": running, "source": "state_dir",
        "version": __version__,     # this command's: no daemon answered
        "mode": last.get("mode", "daemon"), "updated": last.get("updated"),
        "files": [], "journald": [], "queue": {"events": 0, "bytes": 0}, "dead_letter": 0,
        "output": {"up": bool(last_out.get("up", False)), "last_error": last_out.get("last_error"),
                   "down_since": last_out.get("down_since"), "down_for_s": None,
                   "hosts": last_out.get("hosts", [redact_url(h) for h in cfg.output.hosts])},
        "rates": {"events_in_per_s": None, "events_out_per_s": None, "bytes_out_per_s": None},
        "lag_bytes": 0, "eta_s": None,
    }
    if not os.path.isdir(os.path.join(state_dir, "spool")):
        out["journald"] = _stopped_journald(cfg, None)
        return out
    contents = read_stopped(state_dir)        # issue 19: readable on a full disk too
    out["files"] = _stopped_files(contents)
    out["journald"] = _stopped_journald(cfg, contents)
    out["queue"] = {"events": contents.queued_events, "bytes": contents.queued_bytes,
                    "in_memory": {"events": 0, "bytes": 0}, "spool": cfg.queue.spool}
    out["dead_letter"] = contents.dead_letters
    out["lag_bytes"] = sum(f["lag_bytes"] for f in out["files"])
    # unread bytes of files rotated away while stopped: found again by content at the next start,
    # unless logrotate deletes them first
    out["bytes_at_risk"] = sum(max(0, f["size"] - f["queued_offset"]) for f in out["files"] if f["state"] == "rotated")
    return out


# ================================================================ the human table (pure)

def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"  # pragma: no cover


def human_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _rate(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:,.0f} {unit}/s"


def bar(done: int, total: int | None, width: int = 20) -> str:
    if total is None:
        return "[" + "?" * width + "]      "
    frac = 1.0 if total <= 0 else max(0.0, min(1.0, done / total))
    n = int(frac * width)
    return "[" + "#" * n + "-" * (width - n) + f"] {frac * 100:5.1f}%"


def _when(ts: float | None, now: float) -> str:
    if not ts:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f" ({human_duration(now - ts)} ago)"


def render(doc: dict[str, Any], state_dir: str, now: float) -> str:
    """`shipper status` as text: a header block, then one row per file."""
    lines: list[str] = []
    running = bool(doc.get("running"))
    mode = doc.get("mode") or "daemon"
    who = "shipper pipe" if mode == "pipe" else "shipper"
    version = f"   version {doc['version']}" if doc.get("version") else ""
    if running:
        up_for = f", up {human_duration(now - doc['started'])}" if doc.get("started") else ""
        pid = f"pid {doc['pid']}" if doc.get("pid") else "pid ?"
        lines.append(f"{who}: running ({pid}{up_for})   state_dir: {state_dir}{version}")
    else:
        lines.append(f"{who}: stopped   state_dir: {state_dir}"
                     + (f"   last seen: {_when(doc.get('updated'), now)}" if doc.get("updated") else "") + version)
    out = doc.get("output") or {}
    hosts = ", ".join(out.get("hosts") or [])
    if not running:
        state = "last known " + ("up" if out.get("up") else "down")
    elif out.get("up"):
        state = "up"
    else:
        state = "BACKING OFF" + (f" since {_when(out.get('down_since'), now)}" if out.get("down_since") else "")
    lines.append(f"output:  {state}" + (f"   {hosts}" if hosts else ""))
    if out.get("last_error"):
        lines.append(f"         last error: {out['last_error']}")
    rates = doc.get("rates") or {}
    if running:
        lines.append(f"rates:   in {_rate(rates.get('events_in_per_s'), 'events')}   "
                     f"out {_rate(rates.get('events_out_per_s'), 'events')}   "
                     f"shipped {human_bytes(rates.get('bytes_out_per_s'))}/s")
    q = doc.get("queue") or {}
    mem = q.get("in_memory") or {}
    in_memory = f", {mem.get('events', 0):,} in flight from memory ({human_bytes(mem.get('bytes', 0))})" \
        if mem.get("events") else ""
    lines.append(f"queue:   {q.get('events', 0):,} events ({human_bytes(q.get('bytes', 0))}){in_memory}   "
                 f"dead letters: {doc.get('dead_letter', 0):,}"
                 + ("   (see: shipper dlq list)" if doc.get("dead_letter") else ""))
    sd = doc.get("state_dir") or {}
    if sd.get("full") or sd.get("quarantined"):          # issue 19: docs/state.md
        lines.append("state:   " + "   ".join(
            ([f"state_dir FULL ({human_bytes(sd.get('free_bytes'))} free): reading paused, sending goes on"]
             if sd.get("full") else [])
            + ([f"{sd['quarantined']} quarantined record(s) (see: shipper state check)"] if sd.get("quarantined") else [])))
    if doc.get("lag_bytes"):
        eta = f"   ETA {human_duration(doc['eta_s'])}" if doc.get("eta_s") is not None else ""
        lines.append(f"backlog: {human_bytes(doc['lag_bytes'])} not yet shipped{eta}")
    if doc.get("bytes_at_risk"):
        lines.append(f"at risk: {human_bytes(doc['bytes_at_risk'])} unread in rotated or deleted files")
    for j in doc.get("journald") or []:
        where = j.get("directory") or "the system journal"
        units = ", ".join(j.get("units") or []) or "every unit"
        lag = j.get("lag_entries")
        behind = "lag unknown" if lag is None else f"{lag:,} entries behind"
        if j.get("lag_seconds"):
            behind += f" ({human_duration(j['lag_seconds'])})"
        lines.append(f"journal: {where} ({units}): {behind}   cursor: {j.get('cursor') or 'none yet'}")
    for i in doc.get("inputs") or []:
        why = ", ".join(f"{r} {n:,}" for r, n in sorted((i.get("dropped") or {}).items()))
        lines.append(f"dropped: {i.get('dropped_total', 0):,} events of {i.get('input')}" + (f" ({why})" if why else ""))
    files = doc.get("files") or []
    if not files:
        if not doc.get("journald"):
            lines.append("files:   none tracked yet")
        return "\n".join(lines) + "\n"
    rows = [("FILE", "INODE", "PROGRESS", "SHIPPED / SIZE", "LAG", "ETA")]
    for f in files:
        size = f.get("size")
        inode = "-" if f.get("inode") is None else str(f["inode"])
        state = f.get("state")
        path = f["path"] + (f" ({state})" if state in ("renamed", "deleted", "finished", "rotated", "copy") else "")
        rows.append((path, inode, bar(int(f.get("offset") or 0), size),
                     f"{human_bytes(f.get('offset'))} / {human_bytes(size)}",
                     human_bytes(f.get("lag_bytes")), human_duration(f.get("eta_s")) if running else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    for r in rows:
        lines.append("  ".join(c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)).rstrip())
    return "\n".join(lines) + "\n"


def status(config_path: str, as_json: bool = False, state_dir: str | None = None) -> int:
    """`--state-dir` alone (no config file) looks at a `shipper pipe` queue or any state dir."""
    if state_dir is not None and not os.path.exists(config_path):
        cfg = Config(state_dir=os.path.expanduser(state_dir), metrics=MetricsConfig(listen=None))
    else:
        cfg = settings.load(config_path)
        if state_dir is not None:
            cfg = dataclasses.replace(cfg, state_dir=os.path.expanduser(state_dir))
    with statedir.as_owner(cfg.state_dir):       # root on another user's state dir: as that user
        now = SystemClock().time()
        doc = collect(cfg, now)
    if as_json:
        print(orjson.dumps(doc).decode())
        return 0
    print(render(doc, cfg.state_dir, now), end="")
    return 0
