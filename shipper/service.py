"""Wiring and lifecycle: state lock, spool, output, metrics, inputs; signals, reload, shutdown order.

Holds no pipeline logic: `Pipeline` does the work, this module builds it (state, then output,
then inputs), starts it, stops it and swaps it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
import signal
import socket
from typing import Any

import orjson

from shipper import __version__, native, sdnotify, settings, statedir
from shipper.clock import IDLE_EARLY_S, Clock, SystemClock
from shipper.config import Config, InputConfig
from shipper.errors import ConfigError, ShipperError
from shipper.events import Events
from shipper.logs import register_secret
from shipper.metrics import Metrics, TelemetryEvents, serve_metrics
from shipper.model import PipelineStatus, is_journal_checkpoint
from shipper.monitor import Monitor
from shipper.pipeline import Pipeline
from shipper.ship import batching
from shipper.ship.sender import Sender
from shipper.ship.template import guard_first_bulk
from shipper.sources.files import FileSource
from shipper.sources.stdin import StdinSource
from shipper.spool import AsyncSpool, SpoolContents

log = logging.getLogger("shipper")

STATUS_FILE = "status.json"
STATUS_EVERY_S = 2.0
# Nothing changed but the time (`without_drift`): status.json is vouched for this often (`shipper
# status` trusts one up to 10 s old) by moving its mtime, which `shipper status` takes as its
# `updated` when newer; it is rewritten when what it says changes, and at most every
# STATUS_DRIFT_EVERY_S when only the drifting figures moved. So an idle daemon neither creates and
# renames a file every 2 s nor serialises a row per file every 6 s (docs/development.md: what an
# idle daemon with 1,000 files spent on it), only one utime.
STATUS_SAME_EVERY_S = 6.0
STATUS_DRIFT_EVERY_S = 60.0


# What status.json says that only drifts: rates and ETAs decay for RATE_WINDOW_S after the last
# line, the state dir's free bytes move with every write anyone makes on that disk, and an output
# down counts its seconds. A change in them alone waits for STATUS_SAME_EVERY_S; before, an idle
# daemon after a burst (or beside a busy disk) rewrote the file every 2 s, a thread hand-over and
# 3-4 wake-ups each (issue 14).
_DRIFTING = ("updated", "rates", "eta_s")
_DRIFTING_FILE = ("rate_bytes_per_s", "eta_s")


def without_drift(doc: dict[str, Any], memo: list[Any] | None = None) -> dict[str, Any]:
    """The status without what only drifts: when this changes, status.json is rewritten at once.
    `memo` (a list the caller keeps) holds the last files list and its part: the status tick of an
    idle daemon passes the same list again (`Monitor.sample`), and its part is not made again."""
    out = {k: v for k, v in doc.items() if k not in _DRIFTING}
    files = doc.get("files", ())
    if memo and memo[0] is files:
        out["files"] = memo[1]
    else:
        out["files"] = [{k: v for k, v in f.items() if k not in _DRIFTING_FILE} for f in files]
        if memo is not None:
            memo[:] = [files, out["files"]]
    for key, drifting in (("state_dir", "free_bytes"), ("output", "down_for_s")):
        part = doc.get(key)
        if isinstance(part, dict):
            out[key] = {k: v for k, v in part.items() if k != drifting}
    return out


class StateLock:
    """One daemon per state_dir: an flock on state_dir/lock, released by the kernel on any exit."""

    def __init__(self, state_dir: str) -> None:
        statedir.make_dir(state_dir)          # 0700 when made here
        self.path = os.path.join(state_dir, "lock")
        self.fd = statedir.open_file(self.path, os.O_RDWR | os.O_CREAT)     # no link followed, 0600
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ShipperError(f"another shipper is running with state_dir {state_dir}") from None
        try:
            os.ftruncate(self.fd, 0)
            os.write(self.fd, str(os.getpid()).encode())
        except OSError:
            pass            # a full disk (issue 19): the flock is the lock, the pid only a note

    def release(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def warn_cleartext_credentials(cfg: Config) -> None:
    """At start: credentials the config would send unencrypted (SPEC, Trust boundaries), never shown."""
    for detail in cfg.output.cleartext_credentials():
        log.warning("credentials sent unencrypted", extra={"detail": detail})


def register_config_secrets(cfg: Config) -> None:
    register_secret(cfg.output.password)
    register_secret(cfg.output.api_key)
    from urllib.parse import urlsplit
    for h in cfg.output.hosts:
        p = urlsplit(h)
        register_secret(p.password)


def write_status(state_dir: str, doc: dict[str, Any]) -> None:
    """Atomically replace state_dir/status.json (read by `shipper status`)."""
    statedir.write_atomically(os.path.join(state_dir, STATUS_FILE), orjson.dumps(doc))


def vouch_status(state_dir: str) -> bool:
    """Say that state_dir/status.json still holds (its mtime now: `shipper status` reads it as the
    time it was last updated). False when it is not there to vouch for (write it instead)."""
    try:
        os.utime(os.path.join(state_dir, STATUS_FILE), follow_symlinks=False)
        return True
    except OSError:
        return False


async def open_state(state_dir: str, clock: Clock, queue_max_bytes: int | None = None) -> AsyncSpool:
    """The spool (queue, checkpoints, dead letters), opened off the loop. A damaged one raises
    StateDamagedError (exit 3) naming the file: SQLite's quick_check first, then every record as it loads."""
    from shipper.spool.salvage import check_at_start  # salvage's other tools are for `shipper state`
    await asyncio.to_thread(check_at_start, state_dir)
    return await AsyncSpool.open(state_dir, clock=clock, queue_max_bytes=queue_max_bytes)


async def build_pipeline(cfg: Config, spool: AsyncSpool, events: Events, clock: Clock, host_name: str | None = None,
                         stdin: tuple[InputConfig, int] | None = None) -> tuple[Pipeline, FileSource | StdinSource]:
    """State, then output, then inputs: the pipeline over what the spool holds, and its source (the
    files of `cfg.inputs`, or with `stdin` = (input, fd) the stream of `shipper pipe`)."""
    return assemble(cfg, spool, await spool.contents(), events, clock, host_name, stdin)


def assemble(cfg: Config, spool: AsyncSpool, contents: SpoolContents, events: Events, clock: Clock,
             host_name: str | None = None, stdin: tuple[InputConfig, int] | None = None
             ) -> tuple[Pipeline, FileSource | StdinSource]:
    """`build_pipeline` over contents already read."""
    sender = Sender(cfg, events, clock)
    guard_first_bulk(sender.client, cfg)    # issue 17: the index template before the first bulk request
    p = Pipeline(cfg, spool, contents, sender, events, clock)
    host = host_name or socket.gethostname()
    source: FileSource | StdinSource
    if stdin is not None:
        source = StdinSource(stdin[0], cfg.output.index, host, p.writer, events, clock, stdin[1])
        p.add_source(source)
        return p, source
    # files see only the file inputs and their checkpoints; each journald input is a source of
    # its own, resuming from the checkpoint stored under its journal key
    journal_cps = {cp.incarnation: cp for cp in contents.checkpoints if is_journal_checkpoint(cp)}
    file_cfg = cfg if not journal_cps and all(i.journald is None for i in cfg.inputs) else \
        dataclasses.replace(cfg, inputs=tuple(i for i in cfg.inputs if i.journald is None))
    file_cps = [cp for cp in contents.checkpoints if cp.incarnation not in journal_cps]
    files = FileSource(file_cfg, file_cps, p.writer, events, clock, host)
    if file_cfg is cfg:
        p.writer.checkpoints_written.append(files.index_written)
    else:
        p.writer.checkpoints_written.append(
            lambda cps: files.index_written([cp for cp in cps if not is_journal_checkpoint(cp)]))
    p.add_source(files)
    for idx, inp in enumerate(cfg.inputs):
        if inp.journald is not None:
            # imported only for a journald input: its imports cost every start otherwise
            from shipper.sources.journald.reader import JournalReaderConfig
            from shipper.sources.journald.source import JournaldSource
            key = JournalReaderConfig.from_input(inp).key
            p.add_source(JournaldSource(cfg, idx, journal_cps.get(key), p.writer, events, clock, host))
    return p, files


class Service:
    """`startup()` (state, output, inputs, READY=1) -> `run()` -> `shutdown()`; signals only set events."""

    def __init__(self, cfg: Config, config_path: str | None = None, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.clock = clock or SystemClock()
        self.metrics = Metrics(self.clock)
        self.events = TelemetryEvents(self.metrics)
        self.monitor = Monitor(self.metrics, self.events, cfg.metrics.health_down_after_s)
        self.stop_event = asyncio.Event()
        self.reload_event = asyncio.Event()
        self.force_event = asyncio.Event()
        self.lock: StateLock | None = None
        self.spool: AsyncSpool | None = None
        self.pipeline: Pipeline | None = None
        self._metrics_runner: Any = None
        self._sigint_count = 0
        self._signalled = asyncio.Event()     # any signal: the run loop looks now
        self._stopped = False
        self._ready = False          # the first scan is done and the inputs are open

    # ---------------------------------------------------------------- lifecycle

    async def startup(self) -> None:
        register_config_secrets(self.cfg)
        warn_cleartext_credentials(self.cfg)
        self.lock = StateLock(self.cfg.state_dir)
        self.spool = await open_state(self.cfg.state_dir, self.clock, self.cfg.queue.max_bytes)
        self.metrics.probe("shipper_state_written_bytes_total", self.spool.written_bytes)
        self.pipeline, _files = await build_pipeline(self.cfg, self.spool, self.events, self.clock)
        if self.cfg.metrics.listen:
            self._metrics_runner = await serve_metrics(self.cfg.metrics.listen, self.metrics, self.health,
                                                       self.status_doc, status_on_any_address=self.cfg.metrics.status)
        self._install_signals()
        # ready means the inputs are open: the first scan has found (and resumed) every file, so a
        # rotation right after READY=1 (or after /health turned 200) cannot move a file we never saw
        await self.pipeline.start()
        self._ready = True
        snap = self.pipeline.snapshot()
        self.events.info("pipeline ready", version=__version__, inputs=len(self.cfg.inputs), queue_events=snap.queue_events,
                         spool=self.cfg.queue.spool,
                         hosts=list(snap.hosts), c_fast_paths=native.splice is not None)
        if native.splice is None:
            log.warning("running without the C fast paths: the same documents at about twice the CPU; "
                        + ("SHIPPER_PURE_PYTHON is set" if native.PURE_PYTHON else
                           "installed without them (no compiler?): reinstall with gcc and the Python headers"))
        for h in self.pipeline.sender.client.hosts:
            if h.proxy is not None:
                log.info("output host reached through a proxy",
                         extra={"host": h.label, "proxy": h.proxy.label, "from": h.proxy_source})
        if self.cfg.output.document_id == "none":
            log.warning(batching.AT_LEAST_ONCE)
        sdnotify.ready()

    def health(self) -> tuple[bool, str]:
        p = self.pipeline
        if p is None or not self._ready:
            return False, "starting"
        if p.failed is not None:
            return False, "pipeline task failed"
        return self.monitor.health(p.snapshot(), self.clock.monotonic())

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sigterm(self) -> None:
        self.stop_event.set()
        self._signalled.set()

    def _on_sighup(self) -> None:
        self.reload_event.set()
        self._signalled.set()

    def _on_sigint(self) -> None:
        self._sigint_count += 1
        self.stop_event.set()
        self._signalled.set()
        if self._sigint_count > 1:
            self.force_event.set()

    async def run(self) -> int:
        """Until a stop signal: watch tasks, refresh status, answer reloads, ping the watchdog."""
        wd = sdnotify.watchdog_interval_s()
        next_wd = 0.0
        next_status = 0.0
        last_doc: dict[str, Any] | None = None
        last_full: dict[str, Any] | None = None      # the last written doc without its `updated`
        last_written = last_vouched = float("-inf")
        memo: list[Any] = []
        while not self.stop_event.is_set():
            p = self.pipeline
            if p is not None and p.failed is not None:
                log.error("pipeline task failed", exc_info=p.failed)
                return 1
            now = self.clock.monotonic()
            if now >= next_status - IDLE_EARLY_S:      # a coalesced wait may end that much early
                # one snapshot and one list of files a tick, for the gauges and the document both
                # (taken on the loop: the pipeline is not thread-safe)
                snap, files, room = self._refresh_gauges()
                doc = self.status_doc(snap, files, room)
                same = without_drift(doc, memo)
                full = {k: v for k, v in doc.items() if k != "updated"}
                # the clock first: comparing the whole doc (a row per file) is worth it once a minute
                drifted = now - last_written >= STATUS_DRIFT_EVERY_S - IDLE_EARLY_S and full != last_full
                vouch_due = now - last_vouched >= STATUS_SAME_EVERY_S - IDLE_EARLY_S
                # vouching is one utime on the loop (no thread); a file not there is written instead
                if same != last_doc or drifted or (vouch_due and not vouch_status(self.cfg.state_dir)):
                    await asyncio.to_thread(self._write_status_safe, doc)
                    last_doc, last_full, last_written, last_vouched = same, full, now, now
                elif vouch_due:
                    last_vouched = now
                next_status = now + STATUS_EVERY_S
            if wd and now >= next_wd - IDLE_EARLY_S:
                sdnotify.watchdog_ping()
                next_wd = now + wd
            if self.reload_event.is_set():
                self.reload_event.clear()
                await self.reload()
            # signals set _signalled; otherwise nothing is due before the next status (or ping)
            due = min(next_status, next_wd) if wd else next_status
            # coalesced with the other idle waits (clock.IDLE_TICK_S) unless a short watchdog needs the time
            await self.clock.wait(self._signalled, min(STATUS_EVERY_S, max(0.05, due - self.clock.monotonic())),
                                  coalesce=not wd or wd >= 5.0)
            self._signalled.clear()
        return 0

    async def shutdown(self) -> None:
        """Stop reading, queue the last lines with their offsets, flush within shutdown_timeout, close."""
        sdnotify.stopping()
        p = self.pipeline
        if p is not None:
            self.events.info("stopping", queue_events=p.snapshot().queue_events)
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
        await p.stop(timeout_s, self.force_event)
        await p.sender.client.close()
        self._stopped = True

    async def reload(self) -> None:
        """SIGHUP: build and validate the new config first; swap the pipeline only if it is valid."""
        if not self.config_path:
            return
        try:
            new = await asyncio.to_thread(settings.load, self.config_path)
        except ConfigError as e:
            log.error("reload rejected, keeping the running config", extra={"error": str(e)})
            return
        if os.path.realpath(new.state_dir) != os.path.realpath(self.cfg.state_dir):
            log.error("reload rejected, keeping the running config",
                      extra={"error": "state_dir cannot change on reload; restart the service"})
            return
        register_config_secrets(new)
        log.info("reloading config", extra={"inputs": len(new.inputs)})
        sdnotify.reloading(self.clock.monotonic())
        # Everything read is committed with its offsets before the swap; unacked batches stay in the
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
        await self.spool.resize_reserve(new.queue.max_bytes)
        self.pipeline, _files = await build_pipeline(new, self.spool, self.events, self.clock)
        self._stopped = False
        await self.pipeline.start()
        self.events.info("config reloaded", inputs=len(new.inputs))
        sdnotify.ready()

    # ---------------------------------------------------------------- telemetry

    def _refresh_gauges(self) -> tuple[PipelineStatus | None, list[dict[str, Any]] | None, dict[str, Any] | None]:
        """Every STATUS_EVERY_S: sample rates, refresh gauges, log progress while catching up.
        Returns the snapshot, its files (with their rates) and the state dir's room, for the status
        document (one statvfs a tick)."""
        p = self.pipeline
        if p is None:
            return None, None, None
        now = self.clock.monotonic()
        snap = p.snapshot()
        room = None
        if self.spool is not None:              # issue 19: the state dir's room
            room = self.spool.room()
            self.metrics.set("shipper_state_dir_full", 1 if room["full"] else 0)
            self.metrics.set("shipper_state_dir_free_bytes", room["free_bytes"] or 0)
        files = self.monitor.sample(snap, now)
        self.monitor.progress(snap, now, files)
        return snap, files, room

    def snapshot(self) -> PipelineStatus | None:
        return self.pipeline.snapshot() if self.pipeline is not None else None

    def status_doc(self, snap: PipelineStatus | None = None, files: list[dict[str, Any]] | None = None,
                   room: dict[str, Any] | None = None) -> dict[str, Any]:
        """The status document; from `snap`, its sampled `files` and the `room` when the tick has them."""
        if snap is None:
            snap, files = self.snapshot(), None
        doc = self.monitor.status_doc(snap, self.clock.monotonic(), files=files)
        if self.spool is not None:              # issue 19: {"full", "free_bytes", "reserve_bytes", "quarantined"}
            room = room if room is not None else self.spool.room()
            doc["state_dir"] = {"path": self.cfg.state_dir, **room}
        return doc

    def _write_status_safe(self, doc: dict[str, Any] | None = None) -> None:
        try:
            doc = doc if doc is not None else self.status_doc()
            if self.stop_event.is_set() and self.spool is not None and self._stopped:
                doc["running"] = False
                doc["daemon"] = "stopped"
            write_status(self.cfg.state_dir, doc)
        except OSError as e:
            log.debug("status file not written", extra={"error": str(e)})


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
