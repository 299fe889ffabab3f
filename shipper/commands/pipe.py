"""`shipper pipe`: stdin through the daemon's parse, durable queue and output, then exit.

Stdin is one stream incarnation with a fresh random id per run; offsets are stream offsets, so a
re-sent record keeps its `_id`s. Records carry no checkpoint (a stream cannot be resumed), so a
later `shipper run` with the same state_dir only delivers what is queued. Exit 0: stdin closed and
everything acknowledged; 1: the output stayed down `--timeout` after stdin closed (the rest stays
queued); 2: bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import signal
import stat
import sys
import time
from typing import Any, Callable, Mapping

from shipper.clock import SystemClock
from shipper.config import Config, InputConfig, MetricsConfig, load_config, parse_duration
from shipper.errors import ConfigError
from shipper.metrics import Metrics, Monitor, TelemetryEvents, serve_metrics
from shipper.model import Line
from shipper.parse.document import DocBuilder
from shipper.pipeline import Pipeline
from shipper.service import STATUS_EVERY_S, StateLock, register_config_secrets, write_status
from shipper.ship.client import redact_url
from shipper.spool import AsyncSpool
from shipper.tail import identity
from shipper.tail.lines import LineSplitter

log = logging.getLogger("shipper.pipe")

STDIN_PATH = "-"              # log.file.path of stdin events
PIPE_CHUNK_BYTES = 256 * 1024
FILE_CHUNK_BYTES = 1024 * 1024
TICK_S = 0.1                  # commit/multiline timer while stdin is quiet


def default_state_dir(env: Mapping[str, str]) -> str:
    """$XDG_STATE_HOME/shipper/pipe, i.e. ~/.local/state/shipper/pipe by default."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "shipper", "pipe")


def build_config(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Config, InputConfig, float]:
    """argv -> (config without file inputs, the stdin input, timeout_s). Raises ConfigError (exit 2)."""
    if args.config:
        cfg = load_config(args.config)
    else:
        for flag, value in (("--url", args.url), ("--index", args.index)):
            if not value:
                raise ConfigError(flag, "is required without -c (shipper pipe --url URL --index NAME)")
        cfg = Config(state_dir=default_state_dir(env), metrics=MetricsConfig(listen=None))
    out = cfg.output
    if args.url:
        if not re.match(r"^https?://[^/\s]+", args.url):
            raise ConfigError("--url", f"expected an http:// or https:// URL, got {redact_url(args.url)!r}")
        out = dataclasses.replace(out, hosts=(args.url.rstrip("/"),))
    if args.index is not None:
        if not args.index.strip():
            raise ConfigError("--index", "must not be empty")
        out = dataclasses.replace(out, index=args.index)
    state_dir = os.path.expanduser(args.state_dir) if args.state_dir else cfg.state_dir
    cfg = dataclasses.replace(cfg, inputs=(), output=out, state_dir=state_dir)
    inp = InputConfig(paths=(STDIN_PATH,), format=args.format or "auto")
    try:
        timeout_s = parse_duration(args.timeout, "--timeout")
    except ConfigError as e:
        raise ConfigError("--timeout", e.message) from None
    return cfg, inp, timeout_s


class StdinSource:
    """Stdin as a source: bounded reads -> LineSplitter -> DocBuilder into the pipeline's
    accumulator (the same parse as a file), covering stream offsets of one incarnation."""

    def __init__(self, p: Pipeline, inp: InputConfig, fd: int) -> None:
        self.p = p
        self.fd = fd
        self.builder = DocBuilder(inp, p.cfg.output.index, p.host_name)
        self.splitter = LineSplitter(0, inp.max_line_bytes)
        self.incarnation = identity.new_incarnation()
        st = os.fstat(fd)
        self.is_file = stat.S_ISREG(st.st_mode)
        # `shipper pipe < big.log`: the size is known, so progress has an end and an ETA
        self.start = os.lseek(fd, 0, os.SEEK_CUR) if self.is_file else 0
        self.size: int | None = st.st_size - self.start if self.is_file else None
        self.bytes_read = 0
        self.eof = False

    def take(self, lines: list[Line]) -> None:
        """Parse lines into the accumulator and extend the range this incarnation covers."""
        p = self.p
        acc = p.acc
        if acc.empty():
            acc.started = p.clock.monotonic()
        if lines:
            n0 = len(acc.parts)
            acc.nbytes += self.builder.build(self.incarnation, STDIN_PATH, lines, p.clock.time(), acc.parts)
            acc.events += len(acc.parts) - n0
            p.read_total += len(lines)
            p.events.lines_read(STDIN_PATH, len(lines), 0)
        end = self.splitter.offset
        cov = acc.covers.get(self.incarnation)
        if cov is None:
            if not lines:
                return
            acc.covers[self.incarnation] = [lines[0][0], end]
        else:
            cov[1] = end

    async def _room(self) -> None:
        """Backpressure: while the queue is full, stop reading (the writer blocks on the pipe)."""
        p = self.p
        while p.queue_bytes >= p.cfg.queue.max_bytes:
            if not p.paused:
                p.paused = True
                p.events.backpressure(True, p.queue_bytes)
            p.space.clear()
            try:
                await asyncio.wait_for(p.space.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        if p.paused:
            p.paused = False
            p.events.backpressure(False, p.queue_bytes)

    async def _feed(self, chunk: bytes) -> None:
        self.bytes_read += len(chunk)
        self.take(self.splitter.feed(chunk))
        if self.p.should_commit():
            await self.p.commit()
        await self._room()

    async def run(self) -> None:
        """Read stdin to its end; there the last line without a newline counts (not when cancelled:
        a line cut by an interrupt is incomplete). Commit what was read."""
        try:
            if self.is_file:
                await self._read_file()
            else:
                await self._read_stream()
        finally:
            self.eof = True
        self.take(self.splitter.flush())
        await self.p.commit()

    async def _read_file(self) -> None:
        while True:
            chunk = await asyncio.to_thread(os.read, self.fd, FILE_CHUNK_BYTES)
            if not chunk:
                return
            await self._feed(chunk)

    async def _read_stream(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 * PIPE_CHUNK_BYTES)
        pipe = os.fdopen(self.fd, "rb", buffering=0, closefd=False)
        try:
            transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except (OSError, ValueError):
            # /dev/null and other files epoll refuses: plain reads, which never block for long there
            pipe.close()
            await self._read_file()
            return
        try:
            while True:
                chunk = await reader.read(PIPE_CHUNK_BYTES)
                if not chunk:
                    return
                await self._feed(chunk)
        finally:
            transport.close()
            try:
                os.set_blocking(self.fd, True)   # leave a terminal or shared pipe as we found it
            except OSError:
                pass

    def file_row(self) -> dict[str, Any]:
        """Stdin as a row of `shipper status`: offsets are stream offsets."""
        queued = self.splitter.offset
        shipped = self.p._shipped_offsets().get(self.incarnation, queued)
        size = self.size if self.size is not None else self.bytes_read
        return {"path": STDIN_PATH, "inode": None, "incarnation": self.incarnation, "offset": shipped,
                "queued_offset": queued, "size": size, "lag_bytes": max(0, size - shipped),
                "state": "closed" if self.eof else "reading"}


def _is_drained(p: Pipeline) -> bool:
    return p.queue_events == 0 and p.acc.empty() and not p.in_flight


class PipeRun:
    """One `shipper pipe` run: lock, spool, output, stdin; read to EOF, then drain or give up."""

    def __init__(self, cfg: Config, inp: InputConfig, timeout_s: float, fd: int = 0) -> None:
        self.cfg = cfg
        self.inp = inp
        self.timeout_s = timeout_s
        self.fd = fd
        self.metrics = Metrics()
        self.events = TelemetryEvents(self.metrics)
        self.monitor = Monitor(self.metrics, self.events, cfg.metrics.health_down_after_s, mode="pipe")
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self.p: Pipeline | None = None
        self.src: StdinSource | None = None
        self._next_status = 0.0

    def _on_signal(self) -> None:
        if self.stop.is_set():
            self.force.set()
        self.stop.set()

    def _rows(self) -> list[dict[str, Any]]:
        return [self.src.file_row()] if self.src is not None else []

    def _status(self) -> dict[str, Any]:
        return self.monitor.status_doc(self.p, time.monotonic(), self._rows())

    def _health(self) -> tuple[bool, str]:
        return self.monitor.health(self.p, time.monotonic())

    def _tick_status(self) -> None:
        assert self.p is not None
        now = time.monotonic()
        files = self.monitor.sample(self.p, now, self._rows())
        self.monitor.progress(self.p, now, files, always=True)
        try:
            write_status(self.cfg.state_dir, self.monitor.status_doc(self.p, now, self._rows()))
        except OSError as e:
            log.debug("status file not written", extra={"error": str(e)})

    async def _ticks_until(self, until: Callable[[], bool], wait_on: asyncio.Future[Any] | None = None) -> None:
        """Run the timers (commit of a quiet accumulator, status, progress line) until `until()`."""
        assert self.p is not None
        p = self.p
        while not until():
            now = time.monotonic()
            if not p.acc.empty() and p.should_commit():
                await p.commit()
            if now >= self._next_status:
                self._tick_status()
                self._next_status = now + STATUS_EVERY_S
            if wait_on is not None:
                await asyncio.wait({wait_on}, timeout=TICK_S)
            else:
                await asyncio.sleep(TICK_S)

    async def run(self) -> int:
        cfg = self.cfg
        register_config_secrets(cfg)
        lock = StateLock(cfg.state_dir)
        runner = None
        aspool: AsyncSpool | None = None
        remaining = 0
        senders: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        try:
            aspool = await AsyncSpool.open(cfg.state_dir)
            p = self.p = Pipeline(cfg, aspool, self.events, SystemClock())
            self.src = StdinSource(p, self.inp, self.fd)
            if cfg.metrics.listen:
                try:
                    runner = await serve_metrics(cfg.metrics.listen, self.metrics, self._health, self._status)
                except OSError as e:
                    log.warning("metrics endpoint unavailable, continuing without it",
                                extra={"listen": cfg.metrics.listen, "error": str(e)})
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal)
            queued_before = p.queue_events
            log.info("pipe started", extra={"state_dir": cfg.state_dir, "incarnation": self.src.incarnation,
                                            "queued_before": queued_before, "stdin_bytes": self.src.size})
            for i in range(cfg.output.max_in_flight):
                senders.append(asyncio.create_task(p.sender(), name=f"sender-{i}"))
            reader = asyncio.create_task(self.src.run(), name="stdin")
            await self._ticks_until(lambda: reader.done() or self.stop.is_set(), reader)
            if not reader.done():           # a stop signal: what was read is queued, the rest is not ours
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                log.warning("pipe interrupted, stdin not read to its end", extra={"read_bytes": self.src.bytes_read})
            elif reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
            await p.commit()
            p.stopping = p.reading_done = True
            p.outbox_ready.set()
            # Drain. Give up only when nothing was acknowledged for timeout_s (an output that is slow
            # but makes progress is waited for), or shutdown_timeout after a stop signal.
            progress = [time.monotonic(), p.shipped_total, p.queue_events]
            stop_deadline: list[float] = []

            def give_up() -> bool:
                now = time.monotonic()
                if (p.shipped_total, p.queue_events) != (progress[1], progress[2]):
                    progress[:] = [now, p.shipped_total, p.queue_events]
                if _is_drained(p) or self.force.is_set():
                    return True
                if self.stop.is_set():
                    if not stop_deadline:
                        stop_deadline.append(now + cfg.shutdown_timeout_s)
                    return now > stop_deadline[0]
                return now - progress[0] > self.timeout_s

            await self._ticks_until(give_up)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for t in senders:
                t.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            if self.p is not None:
                await self.p.client.close()
            if runner is not None:
                await runner.cleanup()
            if aspool is not None:
                remaining = (await aspool.contents()).queued_events
                await aspool.close()
                if self.p is not None:
                    try:
                        doc = self._status()
                        doc.update(running=False, daemon="stopped")
                        write_status(cfg.state_dir, doc)
                    except OSError:
                        pass
            lock.release()
        assert self.p is not None and aspool is not None
        p = self.p
        log.info("pipe finished", extra={"read_total": p.read_total, "shipped_total": p.shipped_total,
                                         "dead_letter": aspool.dead_letters, "queued": remaining})
        if remaining == 0:
            return 0
        self._tell_how_to_resume(remaining, p.last_error)
        return 1

    def _tell_how_to_resume(self, remaining: int, last_error: str | None) -> None:
        from shipper.logs import redact
        cfg = self.cfg
        why = ("interrupted" if self.stop.is_set() else
               f"the output made no progress for {self.timeout_s:g}s after stdin closed")
        host = redact_url(cfg.output.hosts[0])
        print(f"shipper pipe: {why}; {remaining} event(s) stay queued in {cfg.state_dir}"
              + (f" (last error: {redact(last_error)})" if last_error else "") + ".\n"
              f"They are kept on disk and delivered exactly once by either:\n"
              f"  shipper pipe --url {host} --index {cfg.output.index!r} --state-dir {cfg.state_dir} < /dev/null\n"
              f"  shipper run -c CONFIG   (a config with state_dir: {cfg.state_dir})",
              file=sys.stderr)


def pipe(args: argparse.Namespace) -> int:
    cfg, inp, timeout_s = build_config(args, os.environ)
    from shipper.logs import setup_logging
    setup_logging(cfg.log_level)
    return asyncio.run(PipeRun(cfg, inp, timeout_s).run())
