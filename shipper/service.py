"""Wiring and lifecycle: state lock, spool, output, metrics, inputs; signals, reload, shutdown order.

Holds no pipeline logic: `Pipeline` does the work, this module starts it, stops it and swaps it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import time
from typing import Any

import orjson

from shipper import native, sdnotify
from shipper.clock import Clock, SystemClock
from shipper.config import Config, load_config
from shipper.errors import ConfigError, ShipperError
from shipper.logs import register_secret
from shipper.metrics import Metrics, Monitor, TelemetryEvents, serve_metrics
from shipper.pipeline import Pipeline
from shipper.spool import AsyncSpool

log = logging.getLogger("shipper")

STATUS_FILE = "status.json"
STATUS_EVERY_S = 2.0


class StateLock:
    """One daemon per state_dir: an flock on state_dir/lock, released by the kernel on any exit."""

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, "lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ShipperError(f"another shipper is running with state_dir {state_dir}") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())

    def release(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def register_config_secrets(cfg: Config) -> None:
    register_secret(cfg.output.password)
    register_secret(cfg.output.api_key)
    from urllib.parse import urlsplit
    for h in cfg.output.hosts:
        p = urlsplit(h)
        register_secret(p.password)


def write_status(state_dir: str, doc: dict[str, Any]) -> None:
    """Atomically replace state_dir/status.json (read by `shipper status`)."""
    path = os.path.join(state_dir, STATUS_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(doc))
    os.replace(tmp, path)


class Service:
    """`startup()` (state, output, inputs, READY=1) -> `run()` -> `shutdown()`; signals only set events."""

    def __init__(self, cfg: Config, config_path: str | None = None, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.clock = clock or SystemClock()
        self.metrics = Metrics()
        self.events = TelemetryEvents(self.metrics)
        self.monitor = Monitor(self.metrics, self.events, cfg.metrics.health_down_after_s)
        self.stop_event = asyncio.Event()
        self.reload_event = asyncio.Event()
        self.force_event = asyncio.Event()
        self.lock: StateLock | None = None
        self.spool: AsyncSpool | None = None
        self.pipeline: Pipeline | None = None
        self._metrics_runner: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sigint_count = 0
        self._ready = False          # the first scan is done and the inputs are open
        self.started_at = time.time()

    # ---------------------------------------------------------------- lifecycle

    async def startup(self) -> None:
        register_config_secrets(self.cfg)
        self.lock = StateLock(self.cfg.state_dir)
        self.spool = await AsyncSpool.open(self.cfg.state_dir)
        self.pipeline = Pipeline(self.cfg, self.spool, self.events, self.clock)
        if self.cfg.metrics.listen:
            self._metrics_runner = await serve_metrics(self.cfg.metrics.listen, self.metrics, self.health,
                                                       self.status_doc)
        self._install_signals()
        self._start_pipeline_tasks()
        # ready means the inputs are open: the first scan has found (and resumed) every file, so a
        # rotation right after READY=1 (or after /health turned 200) cannot move a file we never saw
        reader = self._tasks[0]
        scanned = asyncio.create_task(self.pipeline.scanned.wait())
        await asyncio.wait({scanned, reader}, return_when=asyncio.FIRST_COMPLETED)
        scanned.cancel()
        if reader.done():
            reader.result()        # the reader died during the first scan: raise its error
        self._ready = True
        self.events.info("pipeline ready", inputs=len(self.cfg.inputs), queue_events=self.pipeline.queue_events,
                         hosts=list(self.pipeline.client.hosts[i].label for i in range(len(self.pipeline.client.hosts))),
                         c_fast_paths=native.splice is not None)
        if native.splice is None:
            log.warning("running without the C fast paths: the same documents at about twice the CPU; "
                        + ("SHIPPER_PURE_PYTHON is set" if native.PURE_PYTHON else
                           "installed without them (no compiler?): reinstall with gcc and the Python headers"))
        sdnotify.ready()

    def _start_pipeline_tasks(self) -> None:
        assert self.pipeline is not None
        p = self.pipeline
        self._tasks = [asyncio.create_task(p.reader(), name="reader")]
        for i in range(self.cfg.output.max_in_flight):
            self._tasks.append(asyncio.create_task(p.sender(), name=f"sender-{i}"))

    def health(self) -> tuple[bool, str]:
        p = self.pipeline
        if p is None or not self._ready:
            return False, "starting"
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return False, f"task {t.get_name()} failed"
        return self.monitor.health(p, time.monotonic())

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop_event.set)
        loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        loop.add_signal_handler(signal.SIGHUP, self.reload_event.set)

    def _on_sigint(self) -> None:
        self._sigint_count += 1
        self.stop_event.set()
        if self._sigint_count > 1:
            self.force_event.set()

    async def run(self) -> int:
        """Until a stop signal: watch tasks, refresh status, answer reloads, ping the watchdog."""
        wd = sdnotify.watchdog_interval_s()
        next_wd = 0.0
        next_status = 0.0
        while not self.stop_event.is_set():
            for t in self._tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    log.error("pipeline task failed", exc_info=exc, extra={"task": t.get_name()})
                    return 1
            now = time.monotonic()
            if now >= next_status:
                self._refresh_gauges()
                await asyncio.to_thread(self._write_status_safe)
                next_status = now + STATUS_EVERY_S
            if wd and now >= next_wd:
                sdnotify.watchdog_ping()
                next_wd = now + wd
            if self.reload_event.is_set():
                self.reload_event.clear()
                await self.reload()
            try:
                await asyncio.wait_for(self._any_signal(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
        return 0

    async def _any_signal(self) -> None:
        stop = asyncio.create_task(self.stop_event.wait())
        rel = asyncio.create_task(self.reload_event.wait())
        try:
            await asyncio.wait({stop, rel}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            rel.cancel()

    async def shutdown(self) -> None:
        """Stop reading, queue the last lines with their offsets, flush within shutdown_timeout, close."""
        sdnotify.stopping()
        p = self.pipeline
        if p is not None:
            self.events.info("stopping", queue_events=p.queue_events)
            await self._stop_pipeline(self.cfg.shutdown_timeout_s)
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self.spool is not None:
            await self.spool.close()
        self._write_status_safe()
        if self.lock is not None:
            self.lock.release()
        self.events.info("stopped")

    async def _stop_pipeline(self, timeout_s: float) -> None:
        p = self.pipeline
        assert p is not None
        reader = self._tasks[0] if self._tasks else None
        p.stopping = True
        p.wake.set()                 # the reader may be waiting for the next write: it sees `stopping` now
        if reader is not None:
            try:
                await asyncio.wait_for(reader, timeout=5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                reader.cancel()
            except Exception:
                log.exception("reader failed during stop")
        await p.stop_reading()
        force = asyncio.create_task(self.force_event.wait())
        drain = asyncio.create_task(p.drain(timeout_s))
        await asyncio.wait({force, drain}, return_when=asyncio.FIRST_COMPLETED)
        force.cancel()
        drain.cancel()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        p.close_files()
        await p.client.close()

    async def reload(self) -> None:
        """SIGHUP: build and validate the new config first; swap the pipeline only if it is valid."""
        if not self.config_path:
            return
        try:
            new = await asyncio.to_thread(load_config, self.config_path)
        except ConfigError as e:
            log.error("reload rejected, keeping the running config", extra={"error": str(e)})
            return
        if os.path.realpath(new.state_dir) != os.path.realpath(self.cfg.state_dir):
            log.error("reload rejected, keeping the running config",
                      extra={"error": "state_dir cannot change on reload; restart the service"})
            return
        register_config_secrets(new)
        log.info("reloading config", extra={"inputs": len(new.inputs)})
        sdnotify.reloading()
        # Everything read is committed with its offsets before the swap; unacked records stay in the
        # spool and the new pipeline re-sends them (same _ids: a 409 at worst, never a duplicate).
        await self._stop_pipeline(0.0)
        logging.getLogger().setLevel(getattr(logging, new.log_level.upper(), logging.INFO))
        if new.metrics.listen != self.cfg.metrics.listen:
            log.warning("metrics.listen changes take effect at the next restart",
                        extra={"running": self.cfg.metrics.listen, "configured": new.metrics.listen})
        self.cfg = new
        self.monitor.health_down_after_s = new.metrics.health_down_after_s
        assert self.spool is not None
        # a cancelled sender's ack may still run on the spool thread: the new pipeline reads the
        # queue and checkpoints once every call submitted before has finished (one worker, FIFO)
        await self.spool.flush()
        self.pipeline = Pipeline(new, self.spool, self.events, self.clock)
        self._start_pipeline_tasks()
        self.events.info("config reloaded", inputs=len(new.inputs))
        sdnotify.ready()

    # ---------------------------------------------------------------- telemetry

    def _refresh_gauges(self) -> None:
        """Every STATUS_EVERY_S: sample rates, refresh gauges, log progress while catching up."""
        p = self.pipeline
        if p is None:
            return
        now = time.monotonic()
        files = self.monitor.sample(p, now)
        self.monitor.progress(p, now, files)

    def status_doc(self) -> dict[str, Any]:
        return self.monitor.status_doc(self.pipeline, time.monotonic())

    def _write_status_safe(self) -> None:
        try:
            doc = self.status_doc()
            if self.stop_event.is_set() and self.spool is not None and self._tasks == []:
                doc["running"] = False
                doc["daemon"] = "stopped"
            write_status(self.cfg.state_dir, doc)
        except OSError as e:
            log.debug("status file not written", extra={"error": str(e)})


def _noop() -> None:
    return None


async def serve(cfg: Config, config_path: str | None = None) -> int:
    svc = Service(cfg, config_path)
    try:
        await svc.startup()
    except ShipperError:
        if svc.lock is not None:
            svc.lock.release()
        raise
    code = 1
    try:
        code = await svc.run()
    finally:
        await svc.shutdown()
    return code
