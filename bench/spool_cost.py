"""What a spool commit and ack cost on diskcache: the old raw-SQL rows vs layouts on the public API.

One commit is what the reader hands over for a full batch: one 2000-document bulk body (~700 KB
raw, gzip level 1, compressed once up front: gzip costs the same in every layout and is printed
apart) plus the checkpoints of the 3 files it covers. One ack drops a batch after Elasticsearch
answered. Each run commits ITERS batches and acks each one DEPTH commits later (a short queue, as
when the output keeps up), on a fresh state dir with the spool's own Cache settings; WAL
checkpoints run between timed calls (the daemon runs them on their own thread).

Figures per call: CPU-us of the calling thread (time.thread_time), wall-us, and SQLite statements
(counted with a trace callback in a separate pass: every statement step gives the GIL away once).
`--busy` adds a thread that runs Python without pause (like the loop thread parsing while the
spool thread commits), with the daemon's 0.2 ms switch interval: every time the spool thread
gives the GIL away it waits about that long to get it back, so wall time grows with the number of
statements.

Layouts (`--layouts`, comma-separated):
  raw       the old spool (073664d): body, meta and checkpoint rows in one multi-row
            INSERT .. ON CONFLICT straight into diskcache's private Cache table; ack is one DELETE
  rows      the same rows through the public API: transact() + set() per row; ack transact() +
            delete() x 2 (body row, meta row)
  push      Cache.push(header+body) (diskcache's queue API, it picks the key) + checkpoint set()s
            in one transact(); ack delete(key)
  cps1      body row + ONE meta row that also carries the commit's checkpoints; ack delete() x 2
  one       ONE row per batch: a small header (metadata) + the body in one bytes value, checkpoint
            set()s beside it in one transact(); ack ONE delete() of its own
  one_cps1  ONE row per batch carrying metadata and checkpoints: a single set(); ack one delete()
  one_settle  one_cps1 when the ack must also write the batch's checkpoints to their own rows
            (the newest of its files: the queue drained)
`--vacuum full|incremental`: SQLite auto_vacuum (diskcache's default is FULL: every ack that frees
pages moves pages from the end of the file into the hole and truncates the file; INCREMENTAL
keeps freed pages on the free list for the next commits).
`--open`: what opening costs with N queued batches: metadata rows read (raw/rows layout) vs every
batch value read to decode its header (one-row layouts).

    .venv/bin/python bench/spool_cost.py                      # every layout, idle and busy, 3 runs
    .venv/bin/python bench/spool_cost.py --layouts raw,one --vacuum incremental --runs 5
    .venv/bin/python bench/spool_cost.py --spools               # before/after: the Spool classes themselves
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import diskcache
import orjson
from isal import igzip

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # shipper
sys.path.insert(0, str(Path(__file__).resolve().parent))      # gen.py

from gen import PinoGenerator  # noqa: E402

DOCS = 2000
ITERS = 150
WARMUP = 20
DEPTH = 4
SWITCH_INTERVAL_S = 0.0002      # what AsyncSpool sets


def make_body(docs: int = DOCS) -> bytes:
    lines = PinoGenerator(seed=7, line_bytes=300).batch(docs)
    return b"".join(b'{"create":{"_index":"logs-app","_id":"k3f9a2c1-%d"}}\n%s\n' % (i, s.encode())
                    for i, s in enumerate(lines))


def checkpoints(i: int) -> list[dict[str, Any]]:
    return [{"incarnation": f"1:{100 + k}:9f8e7d6c5b4a3928", "path": f"/var/log/app/app-{k}.log", "dev": 64769,
             "inode": 100 + k, "fp_len": 256, "fp": "9f8e7d6c5b4a39281716151413121110", "offset": 700_000 * i + k,
             "size": 700_000 * i + 5000, "updated": 1.7e9 + i, "finished": False} for k in range(3)]


PAGE_SIZE = 4096


def open_cache(path: str, vacuum: str) -> diskcache.Cache:
    return diskcache.Cache(path, sqlite_page_size=PAGE_SIZE, size_limit=2**62, eviction_policy="none", cull_limit=0, statistics=False,
                           tag_index=False, disk_min_file_size=2**30, sqlite_synchronous=1,
                           sqlite_cache_size=-1024, sqlite_mmap_size=0, sqlite_wal_autocheckpoint=0,
                           sqlite_auto_vacuum=1 if vacuum == "full" else 2)


HEADER = struct.Struct("<BI")     # version, metadata length; then orjson metadata, then the body


def pack(meta: dict[str, Any], stored: bytes) -> bytes:
    m = orjson.dumps(meta)
    return b"".join((HEADER.pack(1, len(m)), m, stored))


def unpack(value: bytes) -> tuple[dict[str, Any], bytes]:
    _v, n = HEADER.unpack_from(value)
    return orjson.loads(memoryview(value)[HEADER.size:HEADER.size + n]), value[HEADER.size + n:]


class Layout:
    def __init__(self, cache: diskcache.Cache) -> None:
        self.cache = cache
        self.keys: dict[int, Any] = {}

    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def ack(self, seq: int) -> None:
        raise NotImplementedError


_UPSERT_HEAD = ("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size,"
                " mode, filename, value) VALUES ")
_UPSERT_ROW = "(?, 1, ?, NULL, ?, 0, NULL, ?, ?, NULL, ?)"
_UPSERT_TAIL = (" ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time,"
                " access_time = excluded.access_time, size = excluded.size, mode = excluded.mode,"
                " filename = NULL, value = excluded.value")


class Raw(Layout):
    """073664d's Spool._upsert and Spool.ack, verbatim in what they execute."""

    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        now = time.time()
        rows: list[tuple[Any, Any]] = [(seq, stored), (f"m:{seq}", meta)]
        rows += [(f"c:{cp['incarnation']}", cp) for cp in cps]
        disk = self.cache.disk
        params: list[Any] = []
        for key, value in rows:
            db_key, _raw = disk.put(key)
            size, mode, _filename, db_value = disk.store(value, False, key=key)
            params.extend((db_key, now, now, size, mode, db_value))
        self.cache._sql(_UPSERT_HEAD + ",".join([_UPSERT_ROW] * len(rows)) + _UPSERT_TAIL, params)

    def ack(self, seq: int) -> None:
        self.cache._sql("DELETE FROM Cache WHERE key IN (?, ?) AND raw = 1", (seq, f"m:{seq}"))


class Rows(Layout):
    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        c = self.cache
        with c.transact():
            c.set(seq, stored)
            c.set(f"m:{seq}", meta)
            for cp in cps:
                c.set(f"c:{cp['incarnation']}", cp)

    def ack(self, seq: int) -> None:
        c = self.cache
        with c.transact():
            c.delete(seq)
            c.delete(f"m:{seq}")


class Push(Layout):
    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        c = self.cache
        with c.transact():
            self.keys[seq] = c.push(pack(meta, stored))
            for cp in cps:
                c.set(f"c:{cp['incarnation']}", cp)

    def ack(self, seq: int) -> None:
        self.cache.delete(self.keys.pop(seq))


class Cps1(Layout):
    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        c = self.cache
        with c.transact():
            c.set(seq, stored)
            c.set(f"m:{seq}", dict(meta, checkpoints=cps))

    def ack(self, seq: int) -> None:
        c = self.cache
        with c.transact():
            c.delete(seq)
            c.delete(f"m:{seq}")


class One(Layout):
    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        c = self.cache
        with c.transact():
            c.set(seq, pack(meta, stored))
            for cp in cps:
                c.set(f"c:{cp['incarnation']}", cp)

    def ack(self, seq: int) -> None:
        self.cache.delete(seq)


class OneCps1(Layout):
    def commit(self, seq: int, stored: bytes, meta: dict[str, Any], cps: list[dict[str, Any]]) -> None:
        self.cache.set(seq, pack(dict(meta, checkpoints=cps), stored))

    def ack(self, seq: int) -> None:
        self.cache.delete(seq)


class OneSettle(OneCps1):
    """one_cps1 when the acked batch still carries the newest checkpoints of its files (nothing
    newer was committed since: the queue drained): the ack also writes them to their own rows."""

    def ack(self, seq: int) -> None:
        c = self.cache
        with c.transact():
            c.delete(seq)
            for cp in checkpoints(seq):
                c.set(f"c:{cp['incarnation']}", cp)


LAYOUTS: dict[str, type[Layout]] = {"raw": Raw, "rows": Rows, "push": Push, "cps1": Cps1, "one": One,
                                    "one_cps1": OneCps1, "one_settle": OneSettle}


class Busy:
    """A thread that runs Python without pause (decode, touch, encode small JSON documents)."""

    def __init__(self) -> None:
        self.docs = [orjson.dumps({"level": 30, "msg": f"request {i} done", "n": i, "req": {"url": "/a/b"}})
                     for i in range(200)]
        self.stop = threading.Event()
        self.rounds = 0
        self.cpu_s = 0.0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def seconds_of_work(self) -> float:
        """How long the thread ran Python so far (its CPU time: it never blocks but on the GIL)."""
        return self.cpu_s

    def run(self) -> None:
        docs = self.docs
        t0 = time.thread_time()
        while not self.stop.is_set():
            self.cpu_s = time.thread_time() - t0
            for d in docs:
                o = orjson.loads(d)
                o["n"] = o["n"] + 1
                o["tag"] = o["msg"][:7]
                orjson.dumps(o)
            self.rounds += 1

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def wal_checkpoint(db: str) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        con.close()


def run_once(names: list[str], stored: bytes, raw_len: int, vacuum: str, busy: bool,
             iters: int) -> dict[str, dict[str, float]]:
    """Every layout on its own fresh state dir, interleaved call by call (a shared machine's load
    then weighs on each alike). Per layout: median CPU-us and wall-us per commit and per ack."""
    tmp = tempfile.mkdtemp(prefix="spool-cost-")
    try:
        lays: dict[str, Layout] = {}
        dbs: dict[str, str] = {}
        statements: dict[str, tuple[int, int]] = {}
        for name in names:
            d = os.path.join(tmp, name)
            cache = open_cache(d, vacuum)
            lays[name] = LAYOUTS[name](cache)
            dbs[name] = os.path.join(d, diskcache.core.DBNAME)
            # bench instrumentation only: a statement's triggers (diskcache's count/size bookkeeping)
            # are traced again with the statement's text, so repeats in a row count once
            counting: list[str] = []
            cache._con.set_trace_callback(lambda s, c=counting: bool(c) and c[-1] == s or c.append(s))
            lays[name].commit(1, stored, meta_of(1, raw_len, len(stored)), checkpoints(1))
            n_commit = len(counting)
            counting.clear()
            lays[name].ack(1)
            statements[name] = (n_commit, len(counting))
            cache._con.set_trace_callback(None)
        samples: dict[str, dict[str, list[int]]] = {n: {"commit_cpu": [], "commit_wall": [], "ack_cpu": [],
                                                         "ack_wall": []} for n in names}
        tt, pc = time.thread_time_ns, time.perf_counter_ns

        def loop() -> None:
            for i in range(2, 2 + WARMUP + iters):
                rec = i >= 2 + WARMUP
                cps = checkpoints(i)
                meta = meta_of(i, raw_len, len(stored))
                for name, lay in lays.items():
                    out = samples[name]
                    c0, w0 = tt(), pc()
                    lay.commit(i, stored, meta, cps)
                    c1, w1 = tt(), pc()
                    if i - DEPTH >= 2:
                        lay.ack(i - DEPTH)
                    c2, w2 = tt(), pc()
                    if rec:
                        out["commit_cpu"].append(c1 - c0)
                        out["commit_wall"].append(w1 - w0)
                        if i - DEPTH >= 2:
                            out["ack_cpu"].append(c2 - c1)
                            out["ack_wall"].append(w2 - w1)
                    if i % 25 == 0:
                        wal_checkpoint(dbs[name])

        old = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            if busy:
                with Busy():
                    loop()
            else:
                loop()
        finally:
            sys.setswitchinterval(old)
        result: dict[str, dict[str, float]] = {}
        for name, lay in lays.items():
            lay.cache.close()
            r = {k: statistics.median(v) / 1e3 for k, v in samples[name].items()}
            r["commit_stmts"], r["ack_stmts"] = statements[name]
            result[name] = r
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def meta_of(seq: int, raw_len: int, stored_len: int) -> dict[str, Any]:
    return {"events": DOCS, "raw_bytes": raw_len, "stored_bytes": stored_len, "gzipped": True,
            "covers": {cp["incarnation"]: (0, cp["offset"]) for cp in checkpoints(seq)}, "at": 1.7e9}


def open_cost(stored: bytes, raw_len: int, n: int) -> dict[str, float]:
    """Seconds to learn every pending batch's metadata at open, with n batches queued."""
    out: dict[str, float] = {}
    for layout in ("rows", "one"):
        tmp = tempfile.mkdtemp(prefix="spool-open-")
        try:
            cache = open_cache(tmp, "incremental")
            lay = LAYOUTS[layout](cache)
            for i in range(1, n + 1):
                lay.commit(i, stored, {"events": DOCS, "raw_bytes": raw_len, "stored_bytes": len(stored),
                                       "gzipped": True, "covers": {"a": (0, i)}, "at": 1.7e9}, checkpoints(i))
            cache.close()
            wal_checkpoint(os.path.join(tmp, diskcache.core.DBNAME))
            cache = open_cache(tmp, "incremental")
            t0 = time.perf_counter()
            metas = 0
            for key in cache.iterkeys():
                if layout == "rows" and isinstance(key, str) and key.startswith("m:"):
                    metas += cache.get(key) is not None
                elif layout == "one" and isinstance(key, int):
                    metas += bool(unpack(cache.get(key))[0])
            out[layout] = time.perf_counter() - t0
            assert metas == n
            cache.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


OLD_SPOOL = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "spool_073664d.py.txt"


def old_spool_class() -> Any:
    """shipper/spool.py as of 073664d (the raw-SQL spool), kept as the upgrade test's fixture."""
    import importlib.util
    spec = importlib.util.spec_from_loader("spool_073664d", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["spool_073664d"] = mod
    exec(compile(OLD_SPOOL.read_text(), str(OLD_SPOOL), "exec"), mod.__dict__)  # noqa: S102 (our own old code)
    return mod.Spool


def run_spools(stored: bytes, busy: bool, iters: int) -> dict[str, dict[str, float]]:
    """The old Spool class against the new one, interleaved: commit() of one stored batch (passed
    as gzip=False: the bytes are compressed already, so gzip is not counted) with the checkpoints
    of 3 files, ack() DEPTH commits later."""
    from shipper.model import Checkpoint
    from shipper.spool import Spool
    tmp = tempfile.mkdtemp(prefix="spool-cost-")
    try:
        spools = {"073664d": old_spool_class()(os.path.join(tmp, "old")), "new": Spool(os.path.join(tmp, "new"))}
        for sp in spools.values():
            sp.set_autocheckpoint(0)
        samples: dict[str, dict[str, list[int]]] = {
            n: {"commit_cpu": [], "commit_wall": [], "ack_cpu": [], "ack_wall": []} for n in spools}
        tt, pc = time.thread_time_ns, time.perf_counter_ns

        def loop() -> None:
            for i in range(WARMUP + iters):
                cps = [Checkpoint.from_dict(d) for d in checkpoints(i)]
                covers = {cp.incarnation: (cp.offset - 700_000, cp.offset) for cp in cps}
                for name, sp in spools.items():
                    c0, w0 = tt(), pc()
                    [(meta, _)] = sp.commit([(stored, DOCS)], covers, cps, False)
                    c1, w1 = tt(), pc()
                    acked = meta.seq - DEPTH
                    if acked >= 1:
                        sp.ack(acked)
                    c2, w2 = tt(), pc()
                    if i >= WARMUP:
                        samples[name]["commit_cpu"].append(c1 - c0)
                        samples[name]["commit_wall"].append(w1 - w0)
                        samples[name]["ack_cpu"].append(c2 - c1)
                        samples[name]["ack_wall"].append(w2 - w1)
                    if i % 25 == 0:
                        wal_checkpoint(sp.db_path)

        old = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        busy_share = 0.0
        try:
            if busy:
                with Busy() as b:
                    w0 = time.perf_counter()
                    loop()
                    busy_share = b.seconds_of_work() / (time.perf_counter() - w0)
            else:
                loop()
        finally:
            sys.setswitchinterval(old)
        for sp in spools.values():
            sp.close()
        out = {n: {k: statistics.median(v) / 1e3 for k, v in d.items()} for n, d in samples.items()}
        for r in out.values():
            r["busy_share"] = busy_share
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--vacuum", default="full,incremental")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=ITERS)
    ap.add_argument("--modes", default="idle,busy")
    ap.add_argument("--open", type=int, default=0, metavar="N", help="also time opening with N queued batches")
    ap.add_argument("--spools", action="store_true",
                    help="the old Spool class (073664d) against the new one instead of the bare layouts")
    ap.add_argument("--page-size", type=int, default=PAGE_SIZE, help="SQLite page size of the new state dirs")
    args = ap.parse_args(argv)
    globals()["PAGE_SIZE"] = args.page_size
    body = make_body()
    t0 = time.thread_time()
    for _ in range(20):
        stored = igzip.compress(body, 1)
    gz_us = (time.thread_time() - t0) / 20 * 1e6
    print(f"batch: {DOCS} docs, {len(body):,} B raw, {len(stored):,} B gzip-1 "
          f"(isal: {gz_us:,.0f} CPU-us, the same in every layout, not counted below)")
    if args.spools:
        print(f"{'spool':10} {'mode':5} | {'commit CPU-us':>22} {'wall-us':>8} | {'ack CPU-us':>20} {'wall-us':>8}")
        for mode in args.modes.split(","):
            runs = [run_spools(stored, mode == "busy", args.iters) for _ in range(args.runs)]
            for name in runs[0]:
                rs = [r[name] for r in runs]
                cc = " ".join(f"{r['commit_cpu']:6.0f}" for r in rs)
                ac = " ".join(f"{r['ack_cpu']:5.0f}" for r in rs)
                cw = statistics.median(r["commit_wall"] for r in rs)
                aw = statistics.median(r["ack_wall"] for r in rs)
                share = f"  (busy thread ran {100 * statistics.median(r['busy_share'] for r in rs):.0f}% of the time)" \
                    if mode == "busy" else ""
                print(f"{name:10} {mode:5} | {cc:>22} {cw:8.0f} | {ac:>20} {aw:8.0f}{share}", flush=True)
        return 0
    names = args.layouts.split(",")
    print(f"{'layout':10} {'vacuum':11} {'mode':5} | {'commit CPU-us':>22} {'wall-us':>8} {'stmts':>5} |"
          f" {'ack CPU-us':>20} {'wall-us':>8} {'stmts':>5}")
    for mode in args.modes.split(","):
        for vacuum in args.vacuum.split(","):
            runs = [run_once(names, stored, len(body), vacuum, mode == "busy", args.iters) for _ in range(args.runs)]
            for name in names:
                rs = [r[name] for r in runs]
                cc = " ".join(f"{r['commit_cpu']:6.0f}" for r in rs)
                ac = " ".join(f"{r['ack_cpu']:5.0f}" for r in rs)
                cw = statistics.median(r["commit_wall"] for r in rs)
                aw = statistics.median(r["ack_wall"] for r in rs)
                print(f"{name:10} {vacuum:11} {mode:5} | {cc:>22} {cw:8.0f} {rs[0]['commit_stmts']:5.0f} |"
                      f" {ac:>20} {aw:8.0f} {rs[0]['ack_stmts']:5.0f}", flush=True)
    if args.open:
        o = open_cost(stored, len(body), args.open)
        mb = args.open * len(stored) / 2**20
        print(f"open with {args.open} batches queued ({mb:.0f} MiB): metadata rows {o['rows'] * 1e3:.0f} ms,"
              f" header in each value {o['one'] * 1e3:.0f} ms ({o['one'] / mb * 1024:.1f} s per GiB queued)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
