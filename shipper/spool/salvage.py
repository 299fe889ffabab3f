"""A damaged spool, examined and salvaged (`shipper state check|repair`, the check at start): read
below diskcache, row by row (values decoded as data by `disk.DataDisk`), since its API stops at the
first page that does not read. A check only reads, beside a running daemon too; a repair writes the
usable rows into a fresh store while no daemon holds the state dir (the loss: spool/lost.py)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sqlite3
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import diskcache

from shipper import statedir
from shipper.errors import ShipperError, StateDamagedError
from shipper.model import BatchMeta
from shipper.spool import rows
from shipper.spool.database import DECODE_ERRORS, damage_text, is_damage, open_cache
from shipper.spool.disk import DataDisk
from shipper.spool.lost import LostRange, lost_ranges, newest_checkpoints
from shipper.spool.store import Spool

DB_NAME = diskcache.core.DBNAME          # cache.db
ASIDE_PREFIX = "spool.damaged-"
SCAN_STEP = 256                          # rows per SELECT while the pages read
PROBE_SPAN = 4096                        # rowids tried one by one past a page that does not read


def db_path(state_dir: str) -> str:
    return os.path.join(state_dir, "spool", DB_NAME)


def read_only(path: str, *, immutable: bool = False) -> sqlite3.Connection:
    """A connection that never writes the spool (`mode=ro`): beside a running daemon it reads the
    newest committed state through the WAL, and closing it never checkpoints a WAL a killed
    daemon left into the database file, as the last read-write connection's close would.
    `immutable`: a file nobody writes (no -shm, no lock, the WAL not read)."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + ("?immutable=1" if immutable else "?mode=ro")
    return sqlite3.connect(uri, isolation_level=None, uri=True)


# ================================================================ SQLite's own check

def quick_check(path: str) -> list[str]:
    """SQLite's `PRAGMA quick_check` (b-tree structure, page and cell layout; not index contents):
    [] when sound, else its messages. An error that is not damage (a full disk, I/O) is raised."""
    try:
        con = read_only(path)
    except sqlite3.DatabaseError as e:
        if not is_damage(e):
            raise
        return [f"SQLite: {e}"]
    try:
        got = [str(r[0]) for r in con.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as e:
        if not is_damage(e):
            raise
        return [f"SQLite: {e}"]
    finally:
        con.close()
    problems: list[str] = []
    for g in got:
        problems.extend(p.strip() for p in g.splitlines() if p.strip() and p.strip() != "ok"
                        and not p.startswith("*** in database"))
    return problems


def check_at_start(state_dir: str) -> None:
    """The daemon's check before it opens the spool: raises StateDamagedError (exit 3) naming the
    file and SQLite's first complaint. The records themselves are checked as the spool loads."""
    path = db_path(state_dir)
    if not os.path.exists(path):
        return
    try:
        problems = quick_check(path)
    except sqlite3.Error:
        # not damage (a full disk: even a read may need the -shm file): the open decides, and on a
        # full disk gives the reserve back first (store.Spool)
        return
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise StateDamagedError(path, f"SQLite quick_check: {problems[0]}{more}")


# ================================================================ reading what can be read

@dataclass(frozen=True, slots=True)
class Bad:
    """A row that is known to exist but cannot be used."""

    key: Any                    # the diskcache key (None when only its rowid is known)
    rowid: int | None
    reason: str
    value: bytes | None = None  # a batch row's bytes when they read but do not decode


@dataclass
class Inspection:
    """Everything read from one spool file: the usable rows by kind, and the bad ones."""

    path: str
    sqlite_problems: list[str] = field(default_factory=list)
    batches: dict[int, tuple[bytes, rows.BatchRow]] = field(default_factory=dict)
    legacy_bodies: dict[int, bytes] = field(default_factory=dict)
    legacy_meta: dict[int, BatchMeta] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)     # "c:<inc>" -> dict
    dead_letters: dict[str, dict[str, Any]] = field(default_factory=dict)    # "d:<n>" -> dict
    quarantined: dict[str, dict[str, Any]] = field(default_factory=dict)     # "q:<seq>" -> dict
    others: dict[Any, Any] = field(default_factory=dict)                     # "n:dlq" and the like
    bad: list[Bad] = field(default_factory=list)
    unreadable_pages: int = 0      # stretches of the table that did not read (rows unknown)
    layouts: Counter[rows.Layout] = field(default_factory=Counter)   # records read, by the layout that wrote them

    @property
    def damaged(self) -> bool:
        return bool(self.sqlite_problems or self.bad or self.unreadable_pages)

    def good_rows(self) -> Iterable[tuple[str | int, bytes | int]]:
        """Every usable row, written in the current layout (rows.py)."""
        for seq, (value, row) in self.batches.items():
            yield seq, rows.pack_batch(row.meta, row.checkpoints, rows.batch_body(row, value))
        for seq, body in self.legacy_bodies.items():
            if seq in self.legacy_meta:
                yield seq, rows.pack_batch(self.legacy_meta[seq], {}, body)
        for key, d in self.checkpoints.items():
            yield key, rows.pack_checkpoint(d)
        for key, d in self.dead_letters.items():
            yield key, rows.pack_dead_letter(d)
        for key, q in self.quarantined.items():
            yield key, rows.pack_quarantine(q)
        for key, v in self.others.items():
            if isinstance(key, (str, int)) and isinstance(v, (bytes, int)):
                yield key, v


def _scan_table(con: sqlite3.Connection, problems: list[str]) -> tuple[dict[int, tuple[Any, ...]], set[int], int]:
    """Every row of diskcache's Cache table that reads: rowid -> (key, raw, mode, filename, value);
    rowids whose row would not read; stretches skipped. Steps over pages that do not read."""
    got: dict[int, tuple[Any, ...]] = {}
    bad: set[int] = set()
    skipped = 0
    last = 0                    # SQLite gives rowids from 1 (diskcache never sets one)
    sql = "SELECT rowid, key, raw, mode, filename, value FROM Cache WHERE rowid > ? ORDER BY rowid LIMIT ?"
    while True:
        try:
            step = con.execute(sql, (last, SCAN_STEP)).fetchall()
        except sqlite3.DatabaseError as e:
            if not is_damage(e):
                raise
            step = None
        if step is not None:
            if not step:
                return got, bad, skipped
            for r in step:
                if int(r[0]) > last:        # a damaged page can answer rowids out of order
                    got[int(r[0])] = tuple(r[1:])
            if int(step[-1][0]) > last:
                last = int(step[-1][0])
                continue
            problems.append(f"the table's rowids go backwards after rowid {last}")
        # a page did not read: first the rowid of the next row (the table's b-tree only)
        try:
            nxt = con.execute("SELECT rowid FROM Cache WHERE rowid > ? ORDER BY rowid LIMIT 1", (last,)).fetchone()
        except sqlite3.DatabaseError as e:
            if not is_damage(e):
                raise
            nxt = None
            problems.append(f"a page of the table after rowid {last} does not read: {e}")
        if nxt is not None and int(nxt[0]) > last:
            rid = int(nxt[0])
            try:
                r = con.execute("SELECT key, raw, mode, filename, value FROM Cache WHERE rowid = ?", (rid,)).fetchone()
                if r is not None:
                    got[rid] = tuple(r)
            except sqlite3.DatabaseError:
                bad.add(rid)        # its cell or its overflow pages are damaged
            last = rid
            continue
        # the leaf holding the next rows is gone: probe rowids one by one past it
        skipped += 1
        found = None
        for rid in range(last + 1, last + 1 + PROBE_SPAN):
            try:
                r = con.execute("SELECT key, raw, mode, filename, value FROM Cache WHERE rowid = ?", (rid,)).fetchone()
            except sqlite3.DatabaseError:
                continue
            if r is not None:
                got[rid] = tuple(r)
                found = rid
                break
        if found is None:
            try:
                mx = con.execute("SELECT max(rowid) FROM Cache").fetchone()
            except sqlite3.DatabaseError:
                mx = None
            if mx is None or mx[0] is None or int(mx[0]) <= last + PROBE_SPAN:
                return got, bad, skipped
            last += PROBE_SPAN
            continue
        last = found


def _scan_index(con: sqlite3.Connection) -> dict[int, tuple[Any, Any]]:
    """rowid -> (key, raw) from the unique index on (key, raw): it names rows whose table page is
    gone. Partial when the index is damaged too."""
    out: dict[int, tuple[Any, Any]] = {}
    try:
        cur = con.execute("SELECT rowid, key, raw FROM Cache INDEXED BY Cache_key_raw WHERE key IS NOT NULL")
        while True:
            chunk = cur.fetchmany(1024)
            if not chunk:
                break
            for rid, key, raw in chunk:
                out[int(rid)] = (key, raw)
    except sqlite3.DatabaseError:
        pass
    return out


def inspect(state_dir: str, *, immutable: bool = False) -> Inspection:
    """Read every row of state_dir/spool/cache.db that can be read and sort it: usable or bad.
    `immutable`: open it as a file nobody writes (no -shm, no lock, the WAL not read), for a
    stopped daemon's spool on a full disk; no quick_check then."""
    path = db_path(state_dir)
    ins = Inspection(path)
    if not immutable:
        try:
            ins.sqlite_problems = quick_check(path)
        except sqlite3.Error as e:
            raise ShipperError(f"{path} cannot be checked: SQLite: {e} (is the disk full?)") from e
    disk = DataDisk(os.path.dirname(path))
    try:
        con = read_only(path, immutable=immutable)
    except sqlite3.Error as e:
        ins.sqlite_problems.append(f"SQLite: {e}")
        return ins
    try:
        problems: list[str] = []
        try:
            table, bad_rowids, skipped = _scan_table(con, problems)
        except sqlite3.DatabaseError as e:      # not even the schema reads
            ins.sqlite_problems.append(damage_text(e))
            return ins
        ins.sqlite_problems.extend(p for p in problems if p not in ins.sqlite_problems)
        ins.unreadable_pages = skipped
        index = _scan_index(con)
        for rid in sorted(set(index) - set(table) - bad_rowids):
            # a row the scan stepped over (a damaged page in front of it), or one a running daemon
            # added after the scan passed its place
            got = _row_or_gone(con, rid, index[rid])
            if got == GONE:
                del index[rid]          # acked since the index was read: gone from both, not damage
            elif got is not None:
                table[rid] = got
    finally:
        con.close()
    for rid in sorted(bad_rowids | (set(index) - set(table))):
        key = None
        if rid in index:
            try:
                key = disk.get(*index[rid])
            except DECODE_ERRORS:
                key = None
        ins.bad.append(Bad(key, rid, "its page in the file does not read"))
    for rid in sorted(table):
        _sort_row(ins, disk, rid, table[rid])
    return ins


GONE: tuple[Any, ...] = ()      # _row_or_gone: the row was deleted since it was named


def _row_or_gone(con: sqlite3.Connection, rid: int, key_raw: tuple[Any, Any]) -> tuple[Any, ...] | None:
    """The row at `rid` the index named; GONE when, in one snapshot, neither the table nor the
    index holds it any more (a running daemon deleted it since: an ack); None when it does not
    read, or the index still names a row the table lacks (damage)."""
    try:
        con.execute("BEGIN")
        try:
            r = con.execute("SELECT key, raw, mode, filename, value FROM Cache WHERE rowid = ?", (rid,)).fetchone()
            if r is not None:
                return tuple(r)
            named = con.execute("SELECT 1 FROM Cache INDEXED BY Cache_key_raw WHERE key = ? AND raw = ? AND rowid = ?",
                                (*key_raw, rid)).fetchone()
            return None if named is not None else GONE
        finally:
            con.execute("COMMIT")
    except sqlite3.DatabaseError:
        return None


def _sort_row(ins: Inspection, disk: DataDisk, rid: int, r: tuple[Any, ...]) -> None:
    db_key, raw, mode, filename, db_value = r
    key: Any = None
    try:
        key = disk.get(db_key, raw)
        value = disk.fetch(mode, filename, db_value, False)
    except (*DECODE_ERRORS, OSError) as e:
        ins.bad.append(Bad(key, rid, f"does not decode ({type(e).__name__}: {e})"))
        return
    if isinstance(key, int):
        if not isinstance(value, bytes):
            ins.bad.append(Bad(key, rid, "a batch row that is not bytes"))
        elif rows.is_batch_row(value):
            try:
                row = rows.unpack_batch(key, value)
                rows.batch_body(row, value)
            except rows.BadRow as e:
                ins.bad.append(Bad(key, rid, str(e), value))
                return
            ins.batches[key] = (value, row)
            ins.layouts[rows.layout_of(value)] += 1
        else:
            ins.legacy_bodies[key] = value
        return
    if not isinstance(key, str):
        ins.others[key] = value
        return
    try:
        if key.startswith(rows.CHECKPOINT):
            ins.checkpoints[key] = rows.unpack_checkpoint(value)
        elif key.startswith(rows.DEAD_LETTER):
            ins.dead_letters[key] = rows.unpack_dead_letter(value)
        elif key.startswith(rows.QUARANTINE):
            ins.quarantined[key] = rows.unpack_quarantine(value)
        elif key.startswith(rows.LEGACY_META):
            seq = int(key[len(rows.LEGACY_META):])
            ins.legacy_meta[seq] = rows.legacy_meta(seq, value)
            ins.layouts["two-row"] += 1
            return
        else:
            ins.others[key] = value
            return
        ins.layouts[rows.layout_of(value)] += 1
    except DECODE_ERRORS as e:
        ins.bad.append(Bad(key, rid, f"does not decode ({type(e).__name__}: {e})"))


# ================================================================ the report and the repair

@dataclass
class Report:
    """What check or repair found, and (repair) did."""

    inspection: Inspection
    lost: list[LostRange]
    lost_checkpoints: list[str]          # incarnations (or keys) whose checkpoint row is gone
    lost_dead_letters: int
    lost_unknown: int                    # bad rows whose key is not known
    aside: str | None = None             # where the damaged spool was put (repair)
    repaired: bool = False


def assess(ins: Inspection) -> Report:
    """What a repair of this inspection keeps and loses (check prints it; repair does it)."""
    good_meta = {seq: row.meta for seq, (_v, row) in ins.batches.items()}
    lost: dict[int, BatchMeta | None] = {}
    lost_cps: list[str] = []
    lost_dl = 0
    unknown = 0
    for b in ins.bad:
        if isinstance(b.key, int):
            meta = None
            if b.value is not None:
                try:
                    meta = rows.unpack_batch(b.key, b.value).meta
                except rows.BadRow:
                    meta = None
            lost[b.key] = meta
        elif isinstance(b.key, str) and b.key.startswith(rows.CHECKPOINT):
            lost_cps.append(b.key[len(rows.CHECKPOINT):])
        elif isinstance(b.key, str) and b.key.startswith(rows.DEAD_LETTER):
            lost_dl += 1
        elif b.key is None:
            unknown += 1
    cps = newest_checkpoints(ins.checkpoints.values(), (row for _v, row in ins.batches.values()))
    closing = [seq for seq, (_v, row) in ins.batches.items() if row.checkpoints]
    return Report(ins, lost_ranges(good_meta, lost, cps, closing=closing), lost_cps, lost_dl, unknown)


def check(state_dir: str) -> Report:
    return assess(inspect(state_dir))


def repair(state_dir: str, now: float) -> Report:
    """Salvage every usable row into a fresh spool, put the damaged one aside as
    state_dir/spool.damaged-<UTC time>/, and verify that the fresh one opens. The caller holds the
    state lock. A sound spool is left alone (`repaired` False). Raises StateDamagedError when the
    fresh spool does not open (nothing is moved then)."""
    ins = inspect(state_dir)
    report = assess(ins)
    if not ins.damaged:
        return report
    spool_dir = os.path.dirname(ins.path)
    stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    work = os.path.join(state_dir, f".repair-{stamp}")
    shutil.rmtree(work, ignore_errors=True)
    fresh = os.path.join(work, "spool")
    statedir.make_subdir(work)
    statedir.make_subdir(fresh)
    cache = open_cache(fresh, os.path.join(fresh, DB_NAME))
    try:
        top = max((int(k[len(rows.DEAD_LETTER):]) for k in ins.dead_letters), default=0)
        with cache.transact():
            for key, value in ins.good_rows():
                cache.set(key, value)
            counter = ins.others.get(rows.NEXT_DEAD_LETTER, 0)
            cache.set(rows.NEXT_DEAD_LETTER, max(int(counter) if isinstance(counter, int) else 0, top))
    finally:
        cache.close()
    problems = quick_check(os.path.join(fresh, DB_NAME))
    if problems:
        raise StateDamagedError(os.path.join(fresh, DB_NAME), f"the salvaged spool fails quick_check: {problems[0]}")
    Spool(work).close()          # loads and decodes every row, as the daemon will
    aside = os.path.join(state_dir, ASIDE_PREFIX + stamp)
    os.rename(spool_dir, aside)
    os.rename(fresh, spool_dir)
    os.rmdir(work)
    _fsync_dir(state_dir)
    report.aside = aside
    report.repaired = True
    return report


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
