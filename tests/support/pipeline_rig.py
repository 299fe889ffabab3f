"""The reading side of a real `Pipeline`, driven in-process on real files with a fake clock.

No Elasticsearch: each `step()` rescans (optionally), reads until nothing moves, checks the open
files for rotation, commits to a real spool in tmp, and takes the committed documents out of the
outbox as if they were acked. `docs` maps `_id` -> source; `ids_by_line` lets a test check every
written line exactly once. `restart()` builds a new Pipeline on the same spool (a daemon restart).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from pathlib import Path
from typing import Any, Iterable

import orjson

from shipper.config import Config, ElasticsearchConfig, InputConfig
from shipper.events import Events
from shipper.pipeline import Pipeline
from shipper.ship import bulk as bulkproto
from shipper.codec import decode_body
from shipper.spool import AsyncSpool, aio


class FakeClock:
    """Monotonic time moves only when told. Wall time is the real clock plus what `advance_wall`
    added: the pipeline compares checkpoint times with file mtimes, which the kernel sets."""

    def __init__(self) -> None:
        self.mono = 1_000.0
        self.wall_offset = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return time.time() + self.wall_offset

    def advance(self, s: float) -> None:
        self.mono += s

    def advance_wall(self, s: float) -> None:
        self.wall_offset += s

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.advance(s)
        await asyncio.sleep(0)


class RecordingEvents(Events):
    """Every occurrence, in order: `seen` is a list of (method name, args)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []
        for name in dir(Events):
            if not name.startswith("_"):
                setattr(self, name, self._recorder(name))

    def _recorder(self, name: str) -> Any:
        def record(*args: Any, **kw: Any) -> None:
            self.seen.append((name, args + tuple(kw.values())))
        return record

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [a for n, a in self.seen if n == name]


def make_config(tmp_path: Path, paths: Iterable[str], **kw: Any) -> Config:
    inp = {k[len("input_"):]: v for k, v in kw.items() if k.startswith("input_")}
    top = {k: v for k, v in kw.items() if not k.startswith("input_")}
    return Config(
        state_dir=str(tmp_path / "state"),
        inputs=(InputConfig(paths=tuple(paths), **inp),),
        output=ElasticsearchConfig(hosts=("http://127.0.0.1:9",), compression="none"),
        **top,
    )


def open_spool(state_dir: str) -> AsyncSpool:
    """AsyncSpool.open without a running loop (the Rig is built synchronously): opened on its thread."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool")
    return AsyncSpool(executor.submit(aio._open, state_dir).result(), executor)


class Rig:
    def __init__(self, tmp_path: Path, paths: Iterable[str], **kw: Any) -> None:
        self.cfg = make_config(tmp_path, paths, **kw)
        self.clock = FakeClock()
        self.events = RecordingEvents()
        self.spool = open_spool(self.cfg.state_dir)
        self.p = Pipeline(self.cfg, self.spool, self.events, self.clock, host_name="rig")
        self.docs: dict[str, dict[str, Any]] = {}
        self.dup_ids: list[str] = []

    async def step(self, *, scan: bool = True, advance_s: float = 0.0, rounds: int = 50) -> None:
        """Rescan (optionally), then read/check/commit until nothing moves; collect the documents."""
        if advance_s:
            self.clock.advance(advance_s)
        p = self.p
        if scan:
            await p.rescan()
        for _ in range(rounds):
            if scan and p._rescan_soon:
                p._rescan_soon = False       # the reader loop rescans soon after; so does a step
                await p.rescan()
            await p.open_waiting()
            moved = p.read_round()
            p.flush_multiline()
            p.check_sources()
            moved = p.read_round() or moved
            await p.commit()
            self._collect()
            if not moved and not p.waiting and not (scan and p._rescan_soon):
                break

    async def settle(self, steps: int = 3, advance_s: float = 2.0) -> None:
        """Several steps with time moving on (grace periods pass, copies are finished)."""
        for _ in range(steps):
            await self.step(advance_s=advance_s)

    def _collect(self) -> None:
        p = self.p
        while p.outbox:
            meta, body = p.outbox.popleft()
            if body is None:
                body = self.spool._spool.read(meta.seq)
            assert body is not None
            for pair in bulkproto.split_pairs(decode_body(body, meta.gzipped)):
                m, src = bulkproto.pair_parts(pair)
                doc_id = str(m["_id"])
                if doc_id in self.docs:
                    self.dup_ids.append(doc_id)
                self.docs[doc_id] = orjson.loads(src)
            self.spool._spool.ack(meta.seq)
        p.cached_bytes = 0

    def messages(self) -> list[str]:
        return [str(d.get("message", d.get("msg", ""))) for d in self.docs.values()]

    def count(self, message: str) -> int:
        return sum(1 for m in self.messages() if m == message)

    async def restart(self) -> None:
        """Stop reading (final commit), close the files, and start a new Pipeline on the same spool."""
        await self.p.stop_reading()
        self._collect()
        self.p.close_files()
        await self.p.client.close()
        self.p = Pipeline(self.cfg, self.spool, self.events, self.clock, host_name="rig")

    async def close(self) -> None:
        self.p.close_files()
        await self.p.client.close()
        await self.spool.close()

    def open_fds(self, under: str | os.PathLike[str]) -> int:
        """How many fds this process holds on files under a directory."""
        n = 0
        prefix = os.fspath(under)
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                    n += 1
            except OSError:
                pass
        return n
