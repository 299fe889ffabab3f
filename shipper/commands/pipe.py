"""`shipper pipe`: stdin through the daemon's parse, durable queue and output, then exit: 0 when
everything was acknowledged, 1 when the output stayed down `--timeout` after stdin closed (the rest
stays queued), 2 on bad usage. A stream has no checkpoint: a later run delivers only what is queued."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

from shipper import __version__, settings
from shipper.clock import SystemClock
from shipper.config import Config, InputConfig, MetricsConfig, parse_duration
from shipper.errors import ConfigError
from shipper.metrics import Metrics, TelemetryEvents, serve_metrics
from shipper.model import PipelineStatus
from shipper.monitor import Monitor
from shipper.pipeline import Pipeline
from shipper.service import (
    STATUS_EVERY_S,
    StateLock,
    build_pipeline,
    open_state,
    register_config_secrets,
    warn_cleartext_credentials,
    write_status,
)
from shipper.ship.client import redact_url
from shipper.sources.stdin import STDIN_PATH, StdinSource
from shipper.spool import AsyncSpool

log = logging.getLogger("shipper.pipe")

TICK_S = 0.1                  # status and drain checks


def default_state_dir(env: Mapping[str, str]) -> str:
    """$XDG_STATE_HOME/shipper/pipe, i.e. ~/.local/state/shipper/pipe by default."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "shipper", "pipe")


def build_config(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Config, InputConfig, float]:
    """argv -> (config without file inputs, the stdin input, timeout_s). Raises ConfigError (exit 2)."""
    if args.config:
        cfg = settings.load(args.config)
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
    # stdin cannot be read twice: every event is queued before it is sent (SPEC, Delivery)
    cfg = dataclasses.replace(cfg, inputs=(), output=out, state_dir=state_dir,
                              queue=dataclasses.replace(cfg.queue, spool="always"))
    inp = InputConfig(paths=(STDIN_PATH,), format=args.format or "auto")
    try:
        timeout_s = parse_duration(args.timeout, "--timeout")
    except ConfigError as e:
        raise ConfigError("--timeout", e.message) from None
    return cfg, inp, timeout_s


class PipeRun:
    """One `shipper pipe` run: lock, spool, output, stdin; read to EOF, then drain or give up."""

    def __init__(self, cfg: Config, inp: InputConfig, timeout_s: float, fd: int = 0) -> None:
        self.cfg = cfg
        self.inp = inp
        self.timeout_s = timeout_s
        self.fd = fd
        self.clock = SystemClock()
        self.metrics = Metrics(self.clock)
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
        if self.src is not None and not self.src.exhausted:
            self.src.interrupt()
            log.warning("pipe interrupted, stdin not read to its end", extra={"read_bytes": self.src.bytes_read})

    def _snapshot(self) -> PipelineStatus | None:
        return self.p.snapshot() if self.p is not None else None

    def _status(self) -> dict[str, Any]:
        return self.monitor.status_doc(self._snapshot(), self.clock.monotonic())

    def _health(self) -> tuple[bool, str]:
        return self.monitor.health(self._snapshot(), self.clock.monotonic())

    def _tick_status(self, snap: PipelineStatus) -> None:
        now = self.clock.monotonic()
        files = self.monitor.sample(snap, now)
        self.monitor.progress(snap, now, files, always=True)
        try:
            write_status(self.cfg.state_dir, self.monitor.status_doc(snap, now, files=files))
        except OSError as e:
            log.debug("status file not written", extra={"error": str(e)})

    async def _ticks_until(self, until: Callable[[PipelineStatus], bool]) -> None:
        """Status and the progress line every STATUS_EVERY_S, until `until(snapshot)`."""
        assert self.p is not None
        while True:
            snap = self.p.snapshot()
            if until(snap) or self.p.failed is not None:
                return
            now = self.clock.monotonic()
            if now >= self._next_status:
                self._tick_status(snap)
                self._next_status = now + STATUS_EVERY_S
            await self.clock.wait(self.force, TICK_S)

    async def run(self) -> int:
        cfg = self.cfg
        register_config_secrets(cfg)
        warn_cleartext_credentials(cfg)
        lock = StateLock(cfg.state_dir)
        runner = None
        aspool: AsyncSpool | None = None
        loop = asyncio.get_running_loop()
        remaining, dead = 0, 0
        try:
            aspool = await open_state(cfg.state_dir, self.clock, cfg.queue.max_bytes)
            p, src = await build_pipeline(cfg, aspool, self.events, self.clock, stdin=(self.inp, self.fd))
            assert isinstance(src, StdinSource)
            self.p, self.src = p, src
            if cfg.metrics.listen:
                try:
                    runner = await serve_metrics(cfg.metrics.listen, self.metrics, self._health, self._status,
                                                 status_on_any_address=cfg.metrics.status)
                except OSError as e:
                    log.warning("metrics endpoint unavailable, continuing without it",
                                extra={"listen": cfg.metrics.listen, "error": str(e)})
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal)
            queued_before = p.snapshot().queue_events
            log.info("pipe started", extra={"version": __version__, "state_dir": cfg.state_dir, "incarnation": src.incarnation,
                                            "queued_before": queued_before, "stdin_bytes": src.size})
            await p.start()
            await self._ticks_until(lambda s: src.exhausted)
            # Drain. Give up only when nothing was acknowledged for timeout_s (an output that is slow
            # but makes progress is waited for), or shutdown_timeout after a stop signal.
            progress = [self.clock.monotonic(), -1, -1]
            stop_deadline: list[float] = []

            def give_up(snap: PipelineStatus) -> bool:
                now = self.clock.monotonic()
                if (snap.shipped_total, snap.queue_events) != (progress[1], progress[2]):
                    progress[:] = [now, snap.shipped_total, snap.queue_events]
                if snap.drained or self.force.is_set():
                    return True
                if self.stop.is_set():
                    if not stop_deadline:
                        stop_deadline.append(now + cfg.shutdown_timeout_s)
                    return now > stop_deadline[0]
                return now - progress[0] > self.timeout_s

            await self._ticks_until(give_up)
            await p.stop(0.0, self.force)
            if p.failed is not None:
                raise p.failed
            contents = await aspool.contents()
            remaining = sum(m.events for m in contents.pending)
            dead = contents.dead_letters
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if self.p is not None:
                await self.p.stop(0.0)
                await self.p.sender.client.close()
            if runner is not None:
                await runner.cleanup()
            if aspool is not None:
                await aspool.close()
                if self.p is not None:
                    try:
                        doc = self._status()
                        doc.update(running=False, daemon="stopped")
                        write_status(cfg.state_dir, doc)
                    except OSError:
                        pass
            lock.release()
        assert self.p is not None
        snap = self.p.snapshot()
        log.info("pipe finished", extra={"read_total": snap.read_total, "shipped_total": snap.shipped_total,
                                         "dead_letter": dead, "queued": remaining})
        if remaining == 0:
            return 0
        self._tell_how_to_resume(remaining, snap.last_error)
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
