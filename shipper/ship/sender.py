"""The sending side: deliver one queued batch until every document is acked or dead-lettered, with
the shared retry state, the output's up/down state and the once-per-episode fault log lines.
Decisions are bulk.py's, backoff.py's and concurrency.py's; client.py does the HTTP; no spool here."""

from __future__ import annotations

import asyncio
import logging
import random

from shipper.clock import Clock
from shipper.codec import decode_body, gzip_compress
from shipper.config import Config
from shipper.errors import TransportError
from shipper.events import Events
from shipper.logs import redact
from shipper.model import Attempt, DeadLetter
from shipper.ship import bulk as bulkproto
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient, Reply
from shipper.ship.concurrency import AdaptiveLimit
from shipper.ship.slots import RequestSlots

log = logging.getLogger("shipper.output")

DOWN_AFTER_FAILURES = 3      # 429/5xx answers in a row before the output counts as down
OVERLOAD_LOG_EVERY_S = 60.0  # an overload warning per host at most this often
FAILURE_STORE_LOG_EVERY_S = 60.0   # a failure-store line per index at most this often

# episode kinds -> the phrase logged once when a host enters that state
_EPISODE_PHRASES = {
    "unreachable": "output host unreachable, retrying with backoff",
    "auth": "output rejected the credentials (HTTP 401); fix username/password/api_key, retrying slowly",
    "forbidden": "output refused the request (HTTP 403); check the user's privileges, retrying slowly",
    "blocked": "index write blocked (read-only index, e.g. disk flood stage); retrying until the block lifts",
    "overloaded": "output overloaded or failing, retrying with backoff",
    "misdirected": "output answered HTTP 400 without an Elasticsearch error (a proxy, or the wrong URL or scheme?); retrying with backoff",
}


class Sender:
    """Posts batches for any number of worker tasks; they share the backoff gate and the AIMD limit."""

    def __init__(self, cfg: Config, events: Events, clock: Clock, rng: random.Random | None = None) -> None:
        self.cfg = cfg.output
        self.events = events
        self.clock = clock
        self.rng = rng or random.Random()
        self.backoff = Backoff(cfg.retry.initial_backoff_s, cfg.retry.max_backoff_s)
        self.client = BulkClient(cfg.output, self.backoff, self.rng, clock)
        self.limit = AdaptiveLimit(max_limit=max(1, cfg.output.max_in_flight))
        self.slots = RequestSlots(self.limit, clock, cfg.output.timeout_s, self._gate)
        self.failures = 0             # whole-request failures in a row, across batches; 0 after any answer that worked
        self.resume_at = 0.0          # clock.monotonic(): no request starts before this
        self.up = True
        self.last_error: str | None = None
        self.last_success = clock.monotonic()
        self._episodes: dict[str, str] = {}   # host -> the fault kind logged for it (":quiet": not logged)
        self._overload_logged: dict[str, float] = {}
        self._failure_store = bulkproto.Tally(FAILURE_STORE_LOG_EVERY_S)
        self.too_large = 0            # requests answered 413 (too large: split), for the merge rule's cap

    # ------------------------------------------------------------------ request slots

    def _gate(self, now: float) -> float:
        """How long before a request may start: the backoff's resume time, or the next usable host."""
        return max(self.resume_at - now, self.client.next_host_ready_in(now))

    @property
    def peak_in_flight(self) -> int:
        """The most requests that were in flight at once."""
        return self.slots.peak_in_flight

    async def reserve(self) -> int:
        """A request slot taken before its batches are (delivery.py): whatever waits when it is
        given goes in that request. Pass it to `deliver_items`, or give it back with `unreserve`."""
        return await self.slots.acquire()

    def unreserve(self, token: int) -> None:
        """A slot reserved and not used: no request went, so no round trip is counted."""
        self.slots.cancel(token)

    async def post(self, attempt: Attempt, token: int | None = None, retry: bool = False) -> Reply | TransportError:
        """One bulk request under the gate and the limit (in the slot `token` when one was
        reserved; a `retry` goes before new requests): the answer, or the transport failure."""
        slots = self.slots
        if token is None:
            token = await slots.acquire(urgent=retry)
        t0 = self.clock.monotonic()
        try:
            reply = await self.client.post_bulk(attempt.body, attempt.gzipped)
        except TransportError as e:
            slots.last_transport_failure = self.clock.monotonic()   # what is in flight now may never answer
            slots.release(token, self.clock.monotonic() - t0, True)
            self.events.bulk_sent(e.host or "?", "error", attempt.count, len(attempt.body), 0.0)
            return e
        except BaseException:
            slots.release(token, self.clock.monotonic() - t0, False)
            raise
        pushback = reply.status in bulkproto.PUSHBACK_STATUSES
        slots.release(token, reply.seconds, pushback)
        self.events.bulk_sent(reply.host, reply.status, attempt.count, len(attempt.body), reply.seconds)
        return reply

    # ------------------------------------------------------------------ delivering

    async def deliver(self, attempt: Attempt) -> list[DeadLetter]:
        """Send until every document is delivered (2xx, 409 on create) or dead. Returns the dead letters.

        Item failures re-send only the failed items; 413 (and a whole-request 400) halve the batch,
        and a single document rejected that way is dead. Everything else is retried: nothing is
        dropped because the destination is down, slow, overloaded, unauthorised or blocked.
        """
        return [d for _, d in await self.deliver_items(attempt)]

    async def deliver_items(self, attempt: Attempt, token: int | None = None) -> list[tuple[int, DeadLetter]]:
        """`deliver`, each dead letter with its document's position in `attempt` (from 0): a request
        that joined several records (ship/merge.py) gives each record back its own. `token`: a
        slot reserved for the first request (`reserve`); it is released whatever happens."""
        try:
            return await self._deliver(attempt, None, token, False)
        except BaseException:
            if token is not None and token in self.slots.starts:
                self.unreserve(token)        # cancelled before the first request took it
            raise

    async def _deliver(self, attempt: Attempt, at: list[int] | None, token: int | None,
                       retry: bool) -> list[tuple[int, DeadLetter]]:
        # `at[i]`: the position in the first attempt of the i-th document of this one (None: i)
        dead: list[tuple[int, DeadLetter]] = []
        pending: list[bytes] | None = None        # the documents, split once anything but full success happened
        item_attempts = 0
        while True:
            res = await self.post(attempt, token, retry)
            token, retry = None, True
            if isinstance(res, TransportError):
                self._transport_failed(res)
                continue
            reply = res
            verdict = bulkproto.judge(reply.status, reply.answer, attempt.count)
            if at is None:
                at = list(range(attempt.count))
            if verdict.kind == "items":
                assert reply.answer is not None
                outcome = bulkproto.classify(reply.answer, attempt.count)
                self.events.bulk_items(outcome.statuses)
                if outcome.failure_store:
                    if pending is None:
                        pending = await asyncio.to_thread(_pairs, attempt)
                    self._failure_store_used(pending, outcome.failure_store)
                if not outcome.retry and not outcome.dead:
                    self._answered(reply, blocked=None)
                    return dead
                if pending is None:
                    pending = _pairs(attempt)
                for i, status, reason in outcome.dead:
                    dead.append((at[i], dead_letter(pending[i], status, reason, self.clock.time())))
                if not outcome.retry:
                    self._answered(reply, blocked=None)
                    return dead
                self._answered(reply, blocked=outcome.first_error if outcome.blocked else None)
                pending = [pending[i] for i in outcome.retry]
                at = [at[i] for i in outcome.retry]
                item_attempts += 1
                if outcome.pushback:
                    self.slots.pushback()
                delay = self.backoff.delay(item_attempts, self.rng)
                self.events.retry_scheduled(f"{len(pending)} item(s): {outcome.first_error}", delay, reply.host)
                await self.clock.sleep(delay)
                attempt = await self.encode(pending)
                continue
            if verdict.kind in ("split", "dead"):
                self._answered(reply, blocked=None)
                if pending is None:
                    pending = _pairs(attempt)
                if verdict.kind == "dead" or len(pending) == 1:
                    now = self.clock.time()
                    dead.extend((at[i], dead_letter(p, reply.status, verdict.reason, now)) for i, p in enumerate(pending))
                    return dead
                if reply.status == 413:
                    self.too_large += 1
                mid = len(pending) // 2
                for half, where in ((pending[:mid], at[:mid]), (pending[mid:], at[mid:])):
                    dead.extend(await self._deliver(await self.encode(half), where, None, True))
                return dead
            self._request_failed(reply, verdict)

    async def encode(self, pairs: list[bytes]) -> Attempt:
        raw = bulkproto.join_pairs(pairs)
        if self.cfg.compression == "gzip":
            return Attempt(await asyncio.to_thread(gzip_compress, raw), True, len(pairs))
        return Attempt(raw, False, len(pairs))

    # ------------------------------------------------------------------ state and episodes

    def _answered(self, reply: Reply, blocked: str | None) -> None:
        """The destination answered and took (or judged) the documents: the connection works."""
        self.failures = 0
        if blocked is not None:
            self._episode(reply.host, "blocked", blocked, 403)
            self._set_state(False, f"{reply.host}: {blocked}")
            return
        self._end_episode(reply.host)
        self._set_state(True, None)

    def _transport_failed(self, e: TransportError) -> None:
        host = e.host or "?"
        self.failures += 1
        now = self.clock.monotonic()
        reason = f"{host}: {e}"
        delay = 0.0
        if len(self.client.hosts) == 1:
            delay = self.backoff.delay(self.failures, self.rng)
            self.resume_at = max(self.resume_at, now + delay)
        else:
            delay = self.client.next_host_ready_in(now)   # 0 when another host can take it now
        self._episode(host, "unreachable", str(e), None)
        if not self.client.any_up(now) or len(self.client.hosts) == 1:
            self._set_state(False, reason)
        self.events.retry_scheduled(reason, delay, host)

    def _request_failed(self, reply: Reply, verdict: bulkproto.RequestVerdict) -> None:
        """A whole-request failure with an answer: 429, 5xx, 401/403, a 403 block, 404, ..."""
        self.failures += 1
        now = self.clock.monotonic()
        kind = {"auth": "auth" if reply.status == 401 else "forbidden", "blocked": "blocked"}.get(
            verdict.kind, "misdirected" if reply.status == 400 else "overloaded")
        reason = f"HTTP {reply.status} from {reply.host}: {verdict.reason}"
        other_host_up = len(self.client.hosts) > 1 and self.client.any_up(now)
        if kind == "overloaded" and other_host_up and reply.retry_after_s is None:
            delay = 0.0        # the host is set aside by the client; another one takes the retry
        else:
            delay = self.backoff.delay(self.failures, self.rng, reply.retry_after_s)
            self.resume_at = max(self.resume_at, now + delay)
        self._episode(reply.host, kind, verdict.reason, reply.status)
        if kind not in ("overloaded", "misdirected") or self.failures >= DOWN_AFTER_FAILURES:
            self._set_state(False, reason)
        else:
            self.last_error = redact(reason)
        self.events.retry_scheduled(reason, delay, reply.host)

    def _episode(self, host: str, kind: str, reason: str, status: int | None) -> None:
        """Log a fault once when a host enters it (not once per retry); the secret never appears.
        Overload episodes (429/5xx between successes) are logged at most once a minute per host:
        a cluster shedding every other request would otherwise log twice a request."""
        if self._episodes.get(host) in (kind, kind + ":quiet"):
            return
        now = self.clock.monotonic()
        if kind == "overloaded" and now - self._overload_logged.get(host, float("-inf")) < OVERLOAD_LOG_EVERY_S:
            self._episodes[host] = kind + ":quiet"
            return
        if kind == "overloaded":
            self._overload_logged[host] = now
        self._episodes[host] = kind
        level = logging.ERROR if kind in ("auth", "forbidden") else logging.WARNING
        log.log(level, _EPISODE_PHRASES[kind], extra={"host": host, "status": status, "reason": reason})

    def _failure_store_used(self, pairs: list[bytes], positions: list[int]) -> None:
        """Items Elasticsearch took into a failure store: delivered (the metric counts them apart);
        one line per index at most once a minute, with the count since its last line."""
        now = self.clock.monotonic()
        for index, n in bulkproto.indices_of(pairs, positions).items():
            count = self._failure_store.add(index, n, now)
            if count:
                log.warning("documents went to the failure store", extra={"index": index, "count": count})

    def _end_episode(self, host: str) -> None:
        kind = self._episodes.pop(host, None)
        if kind is not None and not kind.endswith(":quiet"):
            log.info("output host recovered", extra={"host": host, "after": kind})

    def _set_state(self, up: bool, error: str | None) -> None:
        if error is not None:
            self.last_error = redact(error)
        if up:
            self.last_success = self.clock.monotonic()
        if up != self.up:
            self.up = up
            self.events.output_state(up, None if up else self.last_error)


def _raw(attempt: Attempt) -> bytes:
    return decode_body(attempt.body, attempt.gzipped)


def _pairs(attempt: Attempt) -> list[bytes]:
    return bulkproto.split_pairs(_raw(attempt))


def dead_letter(pair: bytes, status: int, reason: str, at: float) -> DeadLetter:
    """The dead letter of one bulk pair; `at` is the wall time it was given up."""
    meta, source = bulkproto.pair_parts(pair)
    return DeadLetter(index=str(meta.get("_index", "")), reason=reason, status=status, document=source,
                      at=at, doc_id=str(meta.get("_id", "")))
