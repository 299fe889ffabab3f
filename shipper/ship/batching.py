"""Pure batching: bulk pairs -> batches within `bulk_max_events`/`bulk_max_bytes`, and when a draft goes.

One grouping rule for everything that becomes bulk requests (drafts read from files, replayed
dead letters). No sleeping and no sending: the draft writer and the senders act on these values.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL_ENOUGH = 0.95            # with a backlog, a draft this full (of bulk_max_events) is committed


def group(parts: list[bytes], max_events: int, max_bytes: int,
          multi: dict[int, int] | None = None) -> list[tuple[bytes, int]]:
    """Bulk pairs -> (body, documents) of at most max_events pairs and about max_bytes each: a group
    closes before the pair that would take it over max_bytes (a single larger pair goes alone).
    Never an empty body. One join per body (a large join releases the GIL). `multi`: parts[i]
    holds multi[i] pairs (the reader's C loop writes a run of them at once, `Draft.multi`); they
    are cut apart only when the parts do not go as one body."""
    return [(b"".join(body), n) for body, n in group_parts(parts, max_events, max_bytes, multi)]


def group_parts(parts: list[bytes], max_events: int, max_bytes: int,
                multi: dict[int, int] | None = None) -> list[tuple[list[bytes], int]]:
    """`group` with each body left as its parts, for a compressor to read one after the other
    (`codec.gzip_compress`): a body is never copied whole only to be compressed."""
    n = len(parts)
    if multi:
        pairs = n + sum(multi.values()) - len(multi)
        if pairs <= max_events and sum(map(len, parts)) <= max_bytes:
            return [(parts, pairs)]
        parts = one_pair_each(parts, multi)
        n = len(parts)
    if n <= max_events and sum(map(len, parts)) <= max_bytes:
        return [(parts, n)] if n else []
    out: list[tuple[list[bytes], int]] = []
    start = 0
    while start < n:
        end = min(n, start + max_events)
        size = 0
        for i in range(start, end):
            size += len(parts[i])
            if size > max_bytes and i > start:
                end = i
                break
        out.append((parts[start:end], end - start))
        start = end
    return out


def group_without_ids(parts: list[bytes], max_events: int, max_bytes: int,
                      multi: dict[int, int] | None = None) -> list[tuple[bytes, int]]:
    """`group`, then every action without its `_id` (`document_id: none`): Elasticsearch picks the
    id. The builders always write one (the sampling and the dead-letter record use it); it is cut
    here, where bodies are made, on the spool thread."""
    return [(without_ids(body), n) for body, n in group(parts, max_events, max_bytes, multi)]


_ID_KEY = b',"_id":"'
# what the start-up log and `shipper check` say with `document_id: none`
AT_LEAST_ONCE = ("document_id: none: delivery is at least once, not exactly once "
                 "(a re-send after an ambiguous failure can index a document twice)")


def without_ids(body: bytes) -> bytes:
    """A bulk body whose action lines (every other line, from the first) lose their `_id`. An action
    is `{"create":{"_index":...,"_id":"<id>"}}`: `_id` comes last and our ids hold no `"`, so the
    last `,"_id":"` of the line starts it (an index name from a field may hold those bytes too)."""
    lines = body.split(b"\n")
    for i in range(0, len(lines) - 1, 2):
        action = lines[i]
        at = action.rfind(_ID_KEY)
        if at >= 0:
            lines[i] = action[:at] + b"}}"
    return b"\n".join(lines)


def one_pair_each(parts: list[bytes], multi: dict[int, int]) -> list[bytes]:
    """The parts with each multi-pair one cut into its pairs (a pair is two lines, the action and
    the document; neither holds a raw newline)."""
    out: list[bytes] = []
    for i, p in enumerate(parts):
        if i not in multi:
            out.append(p)
            continue
        lines = p.split(b"\n")
        out.extend(lines[k] + b"\n" + lines[k + 1] + b"\n" for k in range(0, len(lines) - 1, 2))
    return out


@dataclass(frozen=True, slots=True)
class DraftState:
    """What the commit decision looks at (times are monotonic seconds)."""

    events: int
    nbytes: int
    started: float
    empty: bool


@dataclass(frozen=True, slots=True)
class Limits:
    max_events: int
    max_bytes: int
    flush_interval_s: float
    flush_min_interval_s: float
    max_in_flight: int


def should_commit(d: DraftState, lim: Limits, now: float, *, backlog: bool, committing: bool,
                  in_flight: int, outbox_empty: bool, last_commit_at: float) -> bool:
    """Does the draft go now? Full (events or bytes), or nearly full while behind; otherwise not
    while another draft is being written; a partial one goes at once when caught up and a request
    slot is free, but at most once per flush_min_interval; else when flush_interval has passed."""
    if d.empty:
        return False
    if d.events >= lim.max_events or d.nbytes >= lim.max_bytes:
        return True
    if backlog and d.events >= lim.max_events * FULL_ENOUGH:
        return True        # behind: a nearly full draft goes rather than a few more lines in a second body
    if committing:
        return False       # the draft being written goes first; this one keeps filling meanwhile
    if (d.events and in_flight < lim.max_in_flight and outbox_empty and not backlog
            and now - last_commit_at >= lim.flush_min_interval_s):
        # caught up and a request slot is free: send now rather than wait for a timer, but at most
        # one partial draft per flush_min_interval: a writer that appends line by line (pino's
        # default) would otherwise cost a request, a spool transaction and an ack per line
        return True
    return now - d.started >= lim.flush_interval_s
