"""`shipper state check|repair`: is the state dir sound, and salvage it when it is not (spool/salvage.py).
check (read-only, beside a running daemon too): exit 0 sound, 3 damaged; repair: 0 when sound or
repaired, 3 when it could not be, 1 while a daemon runs on it. `render` (pure) says what was found,
kept and lost, by file and offset range."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Literal

from shipper import settings, statedir
from shipper.clock import SystemClock
from shipper.commands.status import daemon_running
from shipper.config import Config, MetricsConfig
from shipper.errors import ShipperError, StateDamagedError
from shipper.spool import rows, salvage
from shipper.spool.lost import LostRange

Action = Literal["check", "repair"]


def _config(config_path: str, state_dir: str | None) -> Config:
    if state_dir is not None and not os.path.exists(config_path):
        return Config(state_dir=os.path.expanduser(state_dir), metrics=MetricsConfig(listen=None))
    cfg = settings.load(config_path)
    if state_dir is not None:
        cfg = dataclasses.replace(cfg, state_dir=os.path.expanduser(state_dir))
    return cfg


def _range(r: LostRange) -> str:
    a = "?" if r.start is None else str(r.start)
    b = "?" if r.end is None else str(r.end)
    seqs = ",".join(str(s) for s in r.seqs[:5]) + ("..." if len(r.seqs) > 5 else "")
    ev = f", {r.events} events" if r.events is not None else ""
    how = "" if r.exact else ", bounded by the records beside it"
    return f"{r.path or '(file unknown: incarnation ' + r.incarnation + ')'}  offsets {a}-{b}  (batch {seqs}{ev}{how})"


def layout_line(layouts: Mapping[rows.Layout, int]) -> str:
    """Which layouts wrote the records found: older ones are read as data, never unpickled."""
    if not layouts:
        return "layout: no records"
    found = ", ".join(f"{n} {rows.LAYOUT_NAMES[k]}" for k, n in sorted(layouts.items()) if n)
    if set(layouts) <= {"data"}:
        return f"layout: {found}"
    return (f"layout: {found}; the older rows are read as data (never unpickled) and written anew in this "
            "version's layout as they are acked or rewritten (a repair rewrites them all)")


def render(report: salvage.Report, action: Action) -> str:
    """The text `shipper state check|repair` prints (pure)."""
    ins = report.inspection
    lines = [f"spool: {ins.path}", layout_line(ins.layouts)]
    if not ins.damaged:
        lines.append("sound: SQLite quick_check ok, every record decodes")
    else:
        lines.append("DAMAGED:")
        for p in ins.sqlite_problems[:5]:
            lines.append(f"  {p}")
        if len(ins.sqlite_problems) > 5:
            lines.append(f"  ... {len(ins.sqlite_problems) - 5} more SQLite complaints")
        for b in ins.bad[:10]:
            lines.append(f"  record {b.key if b.key is not None else '(key unknown)'}"
                         f"{'' if b.rowid is None else f' (row {b.rowid})'}: {b.reason}")
        if len(ins.bad) > 10:
            lines.append(f"  ... {len(ins.bad) - 10} more records")
        if ins.unreadable_pages:
            lines.append(f"  {ins.unreadable_pages} stretch(es) of the table did not read")
    events = sum(row.meta.events for _v, row in ins.batches.values())
    kept = "kept" if action == "repair" and report.repaired else ("readable" if ins.damaged else "held")
    lines.append(f"{kept}: {len(ins.batches) + len(ins.legacy_bodies)} queued records ({events} events), "
                 f"{len(ins.checkpoints)} checkpoint rows, {len(ins.dead_letters)} dead letters"
                 + (f", {len(ins.quarantined)} quarantined records" if ins.quarantined else ""))
    for q in ins.quarantined.values():
        ranges = ", ".join(f"{inc} {r[0]}-{r[1]}" for inc, r in dict(q.get("covers") or {}).items())
        lines.append(f"  quarantined batch {q.get('seq')}: {q.get('reason')}" + (f" ({ranges})" if ranges else ""))
    if ins.damaged:
        verb = "lost" if action == "repair" and report.repaired else "a repair loses"
        gone = [r for r in report.lost if not r.reread]
        again = [r for r in report.lost if r.reread]
        if gone:
            lines.append(f"{verb}: queued lines not known to be in Elasticsearch; look at them in the files:")
            lines.extend(f"  {_range(r)}" for r in gone)
        if again:
            lines.append("read again from the file at the next start (same _ids: no duplicates), if it still holds them:")
            lines.extend(f"  {_range(r)}" for r in again)
        if report.lost_checkpoints:
            lines.append(f"{verb}: the checkpoints of {len(report.lost_checkpoints)} file(s) "
                         "(read again as new files, per start_at): " + ", ".join(report.lost_checkpoints[:10]))
        if report.lost_dead_letters:
            lines.append(f"{verb}: {report.lost_dead_letters} dead letter(s)")
        if report.lost_unknown:
            lines.append(f"{verb}: {report.lost_unknown} record(s) whose key did not read")
        if ins.unreadable_pages:
            lines.append(f"{verb}: whatever the {ins.unreadable_pages} unreadable stretch(es) of the table held "
                         "(records not known by key; files whose checkpoint is lost are read again per start_at)")
        if not (gone or again or report.lost_checkpoints or report.lost_dead_letters or report.lost_unknown
                or ins.unreadable_pages):
            lines.append(f"{verb}: nothing that was queued (the damage is in the file's structure)")
    if action == "check":
        lines.append("run `shipper state repair` to salvage it" if ins.damaged else "nothing to do")
    elif report.repaired:
        lines.append(f"damaged spool set aside: {report.aside}")
        lines.append("repaired: the state dir is ready, `shipper run` starts on it")
    else:
        lines.append("nothing to repair")
    return "\n".join(lines) + "\n"


def state(config_path: str, action: Action, state_dir: str | None = None) -> int:
    cfg = _config(config_path, state_dir)
    with statedir.as_owner(cfg.state_dir):       # root on another user's state dir: as that user
        return _state(cfg, action)


def _state(cfg: Config, action: Action) -> int:
    path = salvage.db_path(cfg.state_dir)
    if not os.path.exists(path):
        print(f"no spool at {path}: nothing to {action}", file=sys.stderr)
        return 0
    if action == "check":
        # read-only, beside a running daemon too: no lock taken, nothing written (salvage.read_only)
        report = salvage.check(cfg.state_dir)
        print(render(report, action), end="")
        return 3 if report.inspection.damaged else 0
    if daemon_running(cfg.state_dir):
        print(f"shipper: a daemon is running on {cfg.state_dir}; `state repair` rewrites the spool, so stop "
              "the daemon first (`systemctl stop shipper`); `shipper state check` reads it while the daemon runs",
              file=sys.stderr)
        return 1
    from shipper.service import StateLock
    try:
        lock = StateLock(cfg.state_dir)         # no daemon may start on it meanwhile
    except ShipperError as e:
        print(f"shipper: {e}", file=sys.stderr)
        return 1
    try:
        try:
            report = salvage.repair(cfg.state_dir, SystemClock().time())
        except (StateDamagedError, OSError) as e:
            print(f"shipper: could not repair {path}: {e}", file=sys.stderr)
            return 3
        print(render(report, action), end="")
        return 0
    finally:
        lock.release()
