"""A real pipeline's reading side, stepped in-process on real files under the fake clock.

No Elasticsearch: each `step()` rescans (optionally), reads until nothing moves, checks the open
files for rotation, commits drafts to a real spool in tmp, and takes the batches out of the
outbox as if they were acked (through the outbox's and the spool's public API). `docs` maps
`_id` -> source; `restart()` builds a new pipeline on the same spool (a daemon restart).
The reader loop itself runs under the same clock in tests/component/test_reader_loop.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from shipper.codec import decode_body
from shipper.config import Config, ElasticsearchConfig, InputConfig
from shipper.model import FileStatus
from shipper.pipeline import Pipeline
from shipper.service import assemble
from shipper.ship import bulk as bulkproto
from shipper.sources.files import FileSource
from shipper.spool import AsyncSpool, Spool
from tests.support.fake_clock import FakeClock, RecordingEvents

__all__ = ["FakeClock", "RecordingEvents", "Rig", "make_config"]


def make_config(tmp_path: Path, paths: Iterable[str], **kw: Any) -> Config:
    """A config for these paths; `input_X=` and `output_X=` set the input's and the output's keys."""
    inp = {k[len("input_"):]: v for k, v in kw.items() if k.startswith("input_")}
    out: dict[str, Any] = {"hosts": ("http://127.0.0.1:9",), "compression": "none"}
    out.update({k[len("output_"):]: v for k, v in kw.items() if k.startswith("output_")})
    top = {k: v for k, v in kw.items() if not k.startswith(("input_", "output_"))}
    return Config(
        state_dir=str(tmp_path / "state"),
        inputs=(InputConfig(paths=tuple(paths), **inp),),
        output=ElasticsearchConfig(**out),
        **top,
    )


def open_spool(state_dir: str) -> AsyncSpool:
    """An AsyncSpool opened synchronously (a test's setup; the daemon uses `await AsyncSpool.open`)."""
    return AsyncSpool(Spool(state_dir))


class Stepped:
    """The pipeline and its file source, stepped by hand: the calls its reader loop makes."""

    def __init__(self, pipeline: Pipeline, files: FileSource) -> None:
        self.pipeline = pipeline
        self.files = files
        self.cfg = pipeline.cfg
        self.writer = pipeline.writer
        self.outbox = pipeline.outbox
        self.client = pipeline.sender.client

    @property
    def sources(self) -> dict[tuple[int, int], Any]:
        return self.files.files.open

    @property
    def waiting(self) -> dict[tuple[int, int], Any]:
        return self.files.files.waiting

    async def rescan(self) -> None:
        await self.files.rescan()

    async def open_waiting(self) -> None:
        await self.files.open_waiting()

    def read_round(self) -> bool:
        c = self.pipeline.clock
        p = self.files.read_round(self.pipeline.room, c.time(), c.monotonic())
        self.pipeline.backlog = p.backlog
        return p.read

    def flush_multiline(self) -> None:
        self.files.flush_due(self.pipeline.clock.monotonic())

    async def check_sources(self) -> None:
        await self.files.check(self.pipeline.clock.monotonic())

    async def commit(self, wait: bool = True) -> None:
        await self.writer.commit(wait)

    def should_commit(self) -> bool:
        return self.pipeline.should_commit()

    @property
    def committing(self) -> bool:
        return self.writer.committing

    def file_status(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.status()]

    def status(self) -> list[FileStatus]:
        return list(self.pipeline.snapshot().files)

    def bytes_at_risk(self) -> int:
        return self.files.bytes_at_risk()

    async def clean_checkpoints(self) -> int:
        return await self.files.clean_checkpoints()

    async def stop_reading(self) -> None:
        await self.files.stop()
        await self.writer.commit()

    def close_files(self) -> None:
        self.files.close()


class Rig:
    def __init__(self, tmp_path: Path, paths: Iterable[str], *, wall: float | None = None, **kw: Any) -> None:
        self.cfg = make_config(tmp_path, paths, **kw)
        self.clock = FakeClock(wall=wall)         # wall: a fixed wall clock (stepped with the monotonic one)
        self.events = RecordingEvents()
        self.spool = open_spool(self.cfg.state_dir)
        self._p: Stepped | None = None
        self.build()
        self.docs: dict[str, dict[str, Any]] = {}
        self.kept: dict[str, dict[str, Any]] = {}   # as Elasticsearch keeps them: the first of an _id (create; 409)
        self.dup_ids: list[str] = []
        # write the checkpoints acks moved at every collect (the keeper's timer does it within
        # CHECKPOINT_EVERY_S..CHECKPOINT_IDLE_S in the daemon); False: as before that timer fired
        self.flush_acked = True

    def build(self) -> Stepped:
        """A new pipeline over what the spool holds (read directly: no spool call is pending here)."""
        p, files = assemble(self.cfg, self.spool, self.spool._spool.contents(), self.events, self.clock, host_name="rig")
        assert isinstance(files, FileSource)
        self._p = Stepped(p, files)
        return self._p

    @property
    def p(self) -> Stepped:
        assert self._p is not None
        return self._p

    async def step(self, *, scan: bool = True, advance_s: float = 0.0, rounds: int = 50) -> None:
        """Rescan (optionally), then read/check/commit until nothing moves; collect the documents."""
        if advance_s:
            self.clock.advance(advance_s)
        p = self.p
        if scan:
            await p.rescan()
        for _ in range(rounds):
            if scan and p.files.wants_rescan:
                await p.rescan()
            await p.open_waiting()
            moved = p.read_round()
            p.flush_multiline()
            await p.check_sources()
            moved = p.read_round() or moved
            await p.commit()
            await self.collect()
            if not moved and not p.waiting and not (scan and p.files.wants_rescan):
                break

    async def settle(self, steps: int = 3, advance_s: float = 2.0) -> None:
        """Several steps with time moving on (grace periods pass, copies are finished)."""
        for _ in range(steps):
            await self.step(advance_s=advance_s)

    async def collect(self) -> None:
        """Take every batch as if Elasticsearch acked it; then write the checkpoints the acks moved
        (what the keeper's timer does within CHECKPOINT_EVERY_S in the daemon)."""
        ob = self.p.outbox
        keeper = self.p.pipeline.keeper
        while len(ob):
            meta, body = ob.take()
            if body is None:
                body = await self.spool.read(meta.seq)
            assert body is not None
            for pair in bulkproto.split_pairs(decode_body(body, meta.gzipped)):
                m, src = bulkproto.pair_parts(pair)
                doc_id = str(m["_id"])
                if doc_id in self.docs:
                    self.dup_ids.append(doc_id)
                self.docs[doc_id] = orjson.loads(src)
                self.kept.setdefault(doc_id, self.docs[doc_id])
            if meta.seq < 0:            # sent from memory (queue.spool: when_behind): the keeper's
                held = await keeper.delivered(meta, [])
            else:
                await self.spool.ack(meta.seq)
                held = meta
            ob.done()
            ob.acked(held, meta.events)
        if self.flush_acked:
            await self.flush_checkpoints()

    async def flush_checkpoints(self) -> None:
        keeper = self.p.pipeline.keeper
        if keeper.window.has_plan:
            await self.p.writer.flush(keeper.plan())

    def messages(self) -> list[str]:
        return [str(d.get("message", d.get("msg", ""))) for d in self.docs.values()]

    def count(self, message: str) -> int:
        return sum(1 for m in self.messages() if m == message)

    async def checkpoints(self) -> list[Any]:
        return list((await self.spool.contents()).checkpoints)

    async def restart(self) -> None:
        """Stop reading (final commit), close the files, and start a new pipeline on the same spool."""
        await self.p.stop_reading()
        await self.collect()
        await self.flush_checkpoints()      # a stop writes them whatever the keeper's timer (Keeper.settle)
        self.p.close_files()
        await self.p.client.close()
        await self.spool.flush()
        self.build()

    async def kill(self) -> None:
        """kill -9 between two steps: the pipeline is dropped where it stands. Nothing read since the
        last commit is kept, what is out from memory is neither acked nor spilled, the checkpoints
        acks moved and not yet flushed are not written; the spool holds what its records wrote
        (every one handed over has been written: each step awaits its commits)."""
        self.p.close_files()
        await self.p.client.close()
        self.build()

    async def close(self) -> None:
        if self._p is not None:
            self._p.close_files()
            await self._p.client.close()
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


RigFactory = Callable[..., Rig]      # the component tests' make_rig fixture (tests/component/conftest.py)
