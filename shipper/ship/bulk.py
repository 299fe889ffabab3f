"""Pure Elasticsearch bulk protocol: split a body into docs, classify an answer per item, Retry-After.

Bodies are NDJSON pairs (`create` action line, source line); orjson never emits a raw newline,
so a body splits cleanly on b"\\n". No HTTP here: ship/client.py sends, this decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from shipper.ship import batching

FILTER_PATH = ("errors,items.*.status,items.*.failure_store,items.*.error.type,items.*.error.reason,"
               "items.*.error.caused_by.type,items.*.error.caused_by.reason")
# An item Elasticsearch took into the data stream's failure store (8.19/9.x: the document did not
# index, e.g. a mapping conflict, and was stored beside the stream with the error): `status` is
# 2xx, `errors` may be false. Delivered, and counted apart under this status label.
FAILURE_STORE = "failure_store"
FAILURE_STORE_MARK = b'"failure_store"'      # in a raw answer: its items must be read one by one

# item errors that a later attempt can cure
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
AUTH_STATUSES = frozenset({401, 403})
# statuses that mean "slow down": the adaptive concurrency limit shrinks on them
PUSHBACK_STATUSES = frozenset({408, 429, 502, 503, 504})
BLOCK_TYPES = frozenset({"cluster_block_exception", "security_exception"})


@dataclass(slots=True)
class Outcome:
    """A bulk answer, per item: delivered (2xx, 409 on create), to retry, or dead (rejected for good)."""

    delivered: list[int] = field(default_factory=list)
    retry: list[int] = field(default_factory=list)
    dead: list[tuple[int, int, str]] = field(default_factory=list)   # (item index, status, reason)
    statuses: dict[int | str, int] = field(default_factory=dict)       # status (or FAILURE_STORE) -> count
    failure_store: list[int] = field(default_factory=list)             # delivered into the failure store
    blocked: bool = False            # some item failed on auth or an index block (slow retries)
    pushback: bool = False           # some item was rejected for load (429, 503): slow down
    first_error: str | None = None   # the first retry reason, for the log


def split_pairs(body: bytes) -> list[bytes]:
    """A bulk body -> one `action\\nsource\\n` chunk per document."""
    parts = body.split(b"\n")
    return [parts[i] + b"\n" + parts[i + 1] + b"\n" for i in range(0, len(parts) - 1, 2)]


def join_pairs(pairs: list[bytes]) -> bytes:
    return b"".join(pairs)


def pair_parts(pair: bytes) -> tuple[dict[str, Any], bytes]:
    """(action metadata, source bytes) of one pair."""
    nl = pair.index(b"\n")
    action = orjson.loads(pair[:nl])
    meta = next(iter(action.values()))
    return meta, pair[nl + 1:].rstrip(b"\n")


def _reason(err: Any) -> str:
    if isinstance(err, dict):
        text = f"{err.get('type', 'error')}: {err.get('reason', '')}"
        cb = err.get("caused_by")
        if isinstance(cb, dict):
            text += f" (caused by {cb.get('type', '')}: {cb.get('reason', '')})"
        return text
    return str(err)


def classify(answer: dict[str, Any], count: int) -> Outcome:
    """Split a 2xx bulk answer into delivered, retry and dead items. 409 on create counts as delivered.

    Nothing is assumed delivered without evidence: an answer that neither says `errors: false`
    nor lists one item per document is retried whole.
    """
    out = Outcome()
    items = answer.get("items")
    if answer.get("errors") is False and not isinstance(items, list):
        out.delivered = list(range(count))
        out.statuses = {201: count}
        return out
    if not isinstance(items, list) or len(items) != count:
        # an answer that does not account for every item: nothing can be assumed delivered
        out.retry = list(range(count))
        out.first_error = f"bulk answer has {len(items) if isinstance(items, list) else 'no'} items for {count} documents"
        return out
    for i, item in enumerate(items):
        body = next(iter(item.values())) if isinstance(item, dict) and item else {}
        status = _int(body.get("status")) if isinstance(body, dict) else 0
        if 200 <= status < 300 and body.get("failure_store") == "used":
            out.statuses[FAILURE_STORE] = out.statuses.get(FAILURE_STORE, 0) + 1
            out.delivered.append(i)
            out.failure_store.append(i)
            continue
        out.statuses[status] = out.statuses.get(status, 0) + 1
        if 200 <= status < 300 or status == 409:
            out.delivered.append(i)
            continue
        err = body.get("error") if isinstance(body, dict) else None
        etype = err.get("type", "") if isinstance(err, dict) else ""
        if status in AUTH_STATUSES or etype in BLOCK_TYPES:
            # a read-only index (flood stage) or missing privileges: fixable, never a reason to drop
            out.retry.append(i)
            out.blocked = True
        elif status in RETRY_STATUSES or status >= 500 or status == 0:
            out.retry.append(i)
            out.pushback = out.pushback or status in PUSHBACK_STATUSES or etype == "es_rejected_execution_exception"
        else:
            # 400 mapper_parsing_exception, illegal_argument_exception, 404 index_not_found ...
            out.dead.append((i, status, _reason(err) if err is not None else f"HTTP {status}"))
            continue
        if out.first_error is None:
            out.first_error = f"{status} {_reason(err)}"
    return out


def indices_of(pairs: list[bytes], positions: list[int]) -> dict[str, int]:
    """The `_index` of the pairs at `positions`, counted (which index a failure-store item was sent to)."""
    counts: dict[str, int] = {}
    for i in positions:
        index = str(pair_parts(pairs[i])[0].get("_index", ""))
        counts[index] = counts.get(index, 0) + 1
    return counts


@dataclass(slots=True)
class Tally:
    """Counts per key reported at most once every `every_s` per key (times are monotonic seconds):
    `add` returns what to report now, everything since the key's last report, or 0."""

    every_s: float
    _pending: dict[str, int] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, n: int, now: float) -> int:
        total = self._pending.pop(key, 0) + n
        if now - self._last.get(key, float("-inf")) < self.every_s:
            self._pending[key] = total
            return 0
        self._last[key] = now
        return total


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


RequestKind = Literal["items", "split", "dead", "auth", "blocked", "retry"]


@dataclass(frozen=True, slots=True)
class RequestVerdict:
    """What to do with a whole bulk answer, before looking at items."""

    kind: RequestKind
    reason: str           # Elasticsearch's error type and reason, or a phrase for the status
    pushback: bool        # the destination asks us to slow down (429, 503, ...)


def judge(status: int, answer: dict[str, Any] | None, count: int) -> RequestVerdict:
    """A bulk answer's status (and error body) -> items | split | dead | auth | blocked | retry.

    2xx with a JSON object: look at the items. 413: halve the batch (one document alone is dead).
    A whole-request 400 from Elasticsearch (an error object) on several documents: halve to find
    the culprit (one alone is dead); a 400 without one is not about a document: retried.
    401/403: credentials or privileges (a 403 cluster block: a read-only index); retried slowly,
    never dropped. Anything else (429, 5xx, 404, an unreadable answer) is retried as a whole.
    """
    reason = status_reason(status, answer)
    if 200 <= status < 300:
        if isinstance(answer, dict):
            return RequestVerdict("items", reason, False)
        return RequestVerdict("retry", f"HTTP {status} with an unreadable bulk answer", False)
    etype = _error_type(answer)
    if status == 400 and not etype:
        # not Elasticsearch's answer (a proxy's page: "The plain HTTP request was sent to HTTPS
        # port", a wrong path): the destination is wrong, not a document. Bisecting would put
        # every document in the dead-letter queue; it is retried until it is fixed
        return RequestVerdict("retry", reason, False)
    if status == 413 or status == 400:
        return RequestVerdict("split" if count > 1 else "dead", reason, False)
    if etype == "cluster_block_exception":
        return RequestVerdict("blocked", reason, status == 429)
    if status in AUTH_STATUSES:
        return RequestVerdict("auth", reason, False)
    return RequestVerdict("retry", reason, status in PUSHBACK_STATUSES)


def _error_type(answer: dict[str, Any] | None) -> str:
    if isinstance(answer, dict):
        err = answer.get("error")
        if isinstance(err, dict):
            return str(err.get("type", ""))
    return ""


def status_reason(status: int, answer: dict[str, Any] | None) -> str:
    """Elasticsearch's `error.type: reason` from a whole-request answer, else a phrase for the status."""
    if isinstance(answer, dict):
        err = answer.get("error")
        if isinstance(err, dict):
            return _reason(err)
        if isinstance(err, str):
            return err
        message = answer.get("message", answer.get("Message"))
        if isinstance(message, str):
            return message          # Amazon OpenSearch's own answers (a refused signature, an expired token)
    return {401: "unauthorized", 403: "forbidden", 404: "not found", 413: "request entity too large",
            429: "too many requests", 502: "bad gateway", 503: "service unavailable",
            504: "gateway timeout"}.get(status, f"HTTP {status}")


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date (counted from `now`, wall time). None
    when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils  # an HTTP date is rare: not worth its import at every start
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if dt is None:
        return None
    return max(0.0, dt.timestamp() - now)


def dead_letter_pairs(items: list[dict[str, Any]], with_ids: bool = True) -> list[bytes]:
    """Stored dead letters -> bulk pairs with their original index and _id, so a replay can never
    add a second document for an event that did arrive (`with_ids` False: `document_id: none`)."""
    pairs = []
    for it in items:
        meta: dict[str, Any] = {"_index": it["index"]}
        if with_ids and it.get("id"):
            meta["_id"] = it["id"]
        pairs.append(orjson.dumps({"create": meta}) + b"\n" + bytes(it["document"]) + b"\n")
    return pairs


def dead_letter_bodies(items: list[dict[str, Any]], max_events: int, max_bytes: int,
                       with_ids: bool = True) -> list[tuple[bytes, int]]:
    """Stored dead letters -> bulk bodies (body, documents) within the batch limits, for a replay."""
    return batching.group(dead_letter_pairs(items, with_ids), max_events, max_bytes)
