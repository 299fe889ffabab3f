"""Pure Elasticsearch bulk protocol: split a body into docs, classify an answer per item, Retry-After.

Bodies are NDJSON pairs (`create` action line, source line); orjson never emits a raw newline,
so a body splits cleanly on b"\\n". No HTTP here: ship/client.py sends, this decides.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

FILTER_PATH = "errors,items.*.status,items.*.error.type,items.*.error.reason,items.*.error.caused_by.type,items.*.error.caused_by.reason"

# item errors that a later attempt can cure
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
AUTH_STATUSES = frozenset({401, 403})


@dataclass(slots=True)
class Outcome:
    """A bulk answer, per item: delivered (2xx, 409 on create), to retry, or dead (rejected for good)."""

    delivered: list[int] = field(default_factory=list)
    retry: list[int] = field(default_factory=list)
    dead: list[tuple[int, int, str]] = field(default_factory=list)   # (item index, status, reason)
    statuses: dict[int, int] = field(default_factory=dict)             # status -> count
    blocked: bool = False            # some item failed on auth or an index block (slow retries)
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
    """Split a 2xx bulk answer into delivered, retry and dead items. 409 on create counts as delivered."""
    out = Outcome()
    if not answer.get("errors"):
        out.delivered = list(range(count))
        out.statuses = {201: count}
        return out
    items = answer.get("items")
    if not isinstance(items, list) or len(items) != count:
        # an answer that does not account for every item: nothing can be assumed delivered
        out.retry = list(range(count))
        out.first_error = f"bulk answer has {len(items) if isinstance(items, list) else 'no'} items for {count} documents"
        return out
    for i, item in enumerate(items):
        body = next(iter(item.values())) if isinstance(item, dict) and item else {}
        status = int(body.get("status", 0)) if isinstance(body, dict) else 0
        out.statuses[status] = out.statuses.get(status, 0) + 1
        if 200 <= status < 300 or status == 409:
            out.delivered.append(i)
            continue
        err = body.get("error") if isinstance(body, dict) else None
        etype = err.get("type", "") if isinstance(err, dict) else ""
        if status in RETRY_STATUSES or status >= 500 or status == 0:
            out.retry.append(i)
        elif status in AUTH_STATUSES or etype == "cluster_block_exception":
            out.retry.append(i)
            out.blocked = True
        else:
            out.dead.append((i, status, _reason(err)))
            continue
        if out.first_error is None:
            out.first_error = f"{status} {_reason(err)}"
    return out


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date. None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if dt is None:
        return None
    return max(0.0, dt.timestamp() - (time.time() if now is None else now))
