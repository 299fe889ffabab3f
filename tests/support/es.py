"""A small synchronous Elasticsearch/osmem client for test oracles, stdlib urllib only.

It reads what the daemon delivered (counts, every document, by `_id` or by a key) and sets up
indices, mappings and blocks. It never goes through shipper code, so it can judge it.
"""

from __future__ import annotations

import collections
import gzip
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from tests.support.promptness import DEFAULT_BOUND_S, Timeline
from tests.support.wait import wait_until


class ESError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {str(body)[:500]}")
        self.status = status
        self.body = body


class ES:
    """Sync client for `url` (e.g. an osmem clone). Reads refresh first unless told not to.

    With a promptness `timeline` (the e2e tests' `es`), `assert_exactly_once` also checks that
    each expected line arrived within its bound (tests/support/promptness.py).
    """

    def __init__(self, url: str, timeout_s: float = 60.0, *, timeline: Timeline | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.timeline = timeline

    # ------------------------------------------------------------------ transport

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        ok: Iterable[int] = (200, 201),
    ) -> Any:
        """One request; `body` is JSON-encoded unless bytes. Raises ESError unless status in `ok`."""
        data: bytes | None
        hdrs = {"Content-Type": "application/json"}
        if body is None:
            data = None
        elif isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        else:
            data = json.dumps(body).encode()
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                status, text = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
            e.close()
        try:
            decoded: Any = json.loads(text) if text else {}
        except ValueError:
            decoded = text.decode(errors="replace")
        if status not in tuple(ok):
            raise ESError(method, path, status, decoded)
        return decoded

    @staticmethod
    def _q(index: str) -> str:
        return urllib.parse.quote(index, safe="*,-")

    # ------------------------------------------------------------------ reads

    def refresh(self, index: str = "*") -> None:
        self.request("POST", f"/{self._q(index)}/_refresh")

    def count(self, index: str = "*", query: Mapping[str, Any] | None = None, *, refresh: bool = True) -> int:
        if refresh:
            self.refresh(index)
        body = None if query is None else {"query": query}
        return int(self.request("POST" if body else "GET", f"/{self._q(index)}/_count", body)["count"])

    def all_docs(
        self, index: str = "*", *, refresh: bool = True, page_size: int = 5000, query: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Every matching document as a hit (`_id`, `_index`, `_source`), beyond 10,000 too.

        Pages with `search_after` on (`_index`, `_id`): stateless, so nothing to clean up, and
        stable while nothing is written. osmem supports scroll as well.
        """
        if refresh:
            self.refresh(index)
        hits: list[dict[str, Any]] = []
        after: list[Any] | None = None
        while True:
            body: dict[str, Any] = {
                "size": page_size,
                "sort": [{"_index": "asc"}, {"_id": "asc"}],
                "query": dict(query) if query else {"match_all": {}},
            }
            if after is not None:
                body["search_after"] = after
            page = self.request("POST", f"/{self._q(index)}/_search", body)["hits"]["hits"]
            for h in page:
                hits.append({"_id": h["_id"], "_index": h["_index"], "_source": h.get("_source", {})})
            if len(page) < page_size:
                return hits
            after = page[-1]["sort"]

    def ids(self, index: str = "*") -> list[str]:
        """All `_id`s (a list: the same `_id` in two indices shows up twice)."""
        return [h["_id"] for h in self.all_docs(index)]

    def get(self, index: str, doc_id: str) -> dict[str, Any] | None:
        """The document (`_id`, `_index`, `_source`) or None when it or the index is missing."""
        path = f"/{self._q(index)}/_doc/{urllib.parse.quote(doc_id, safe='')}"
        res = self.request("GET", path, ok=(200, 404))
        if not res.get("found"):
            return None
        return {"_id": res["_id"], "_index": res["_index"], "_source": res.get("_source", {})}

    def search(self, body: Mapping[str, Any], index: str = "*", *, refresh: bool = True) -> dict[str, Any]:
        if refresh:
            self.refresh(index)
        result: dict[str, Any] = self.request("POST", f"/{self._q(index)}/_search", dict(body))
        return result

    def indices(self) -> list[str]:
        return sorted(row["index"] for row in self.request("GET", "/_cat/indices?format=json"))

    # ------------------------------------------------------------------ writes and setup

    def create_index(
        self, name: str, mappings: Mapping[str, Any] | None = None, settings: Mapping[str, Any] | None = None
    ) -> None:
        body: dict[str, Any] = {}
        if mappings is not None:
            body["mappings"] = dict(mappings)
        if settings is not None:
            body["settings"] = dict(settings)
        self.request("PUT", f"/{self._q(name)}", body)

    def delete_index(self, name: str) -> None:
        self.request("DELETE", f"/{self._q(name)}", ok=(200, 404))

    def put_settings(self, index: str, settings: Mapping[str, Any]) -> None:
        """E.g. `{"index.blocks.read_only_allow_delete": True}`; a value of None resets it."""
        self.request("PUT", f"/{self._q(index)}/_settings", dict(settings))

    def block_writes(self, index: str, kind: str = "write") -> None:
        """Set `index.blocks.<kind>` (write and read_only answer 403, read_only_allow_delete 429)."""
        self.put_settings(index, {f"index.blocks.{kind}": True})

    def unblock_writes(self, index: str, kind: str = "write") -> None:
        self.put_settings(index, {f"index.blocks.{kind}": None})

    def bulk_create(
        self,
        index: str,
        docs: Iterable[Mapping[str, Any]],
        *,
        ids: Iterable[str] | None = None,
        compress: bool = False,
    ) -> dict[str, Any]:
        """Index `docs` with `create` in one bulk request; raises if any item failed."""
        lines: list[bytes] = []
        id_iter = iter(ids) if ids is not None else None
        for doc in docs:
            action: dict[str, Any] = {"_index": index}
            if id_iter is not None:
                action["_id"] = next(id_iter)
            lines.append(json.dumps({"create": action}).encode())
            lines.append(json.dumps(doc).encode())
        body = b"\n".join(lines) + b"\n"
        headers = {"Content-Type": "application/x-ndjson"}
        if compress:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        res: dict[str, Any] = self.request("POST", "/_bulk", body, headers=headers)
        if res.get("errors"):
            bad = [i for i in res["items"] if next(iter(i.values())).get("status", 0) >= 300]
            raise AssertionError(f"bulk_create: {len(bad)} items failed, e.g. {bad[:3]}")
        return res

    # ------------------------------------------------------------------ oracle

    def assert_exactly_once(
        self,
        expected_keys: Iterable[Hashable],
        key_fn: Callable[[dict[str, Any]], Hashable] | None = None,
        *,
        index: str = "*",
        allow_extra: bool = False,
        bound_s: float | None = DEFAULT_BOUND_S,
        written: Mapping[Hashable, float] | Callable[[dict[str, Any]], float] | None = None,
    ) -> list[dict[str, Any]]:
        """Every expected key is in exactly one document, and (with a timeline) each of those
        arrived within `bound_s` of its write (`written`: see Timeline.assert_prompt); returns the
        documents for more checks. `bound_s=None` skips promptness: only where the test says why."""
        expected = list(expected_keys)
        fn = key_fn or seq_key
        docs = self._once_due(index, expected, fn, bound_s)
        assert_exactly_once(docs, expected, key_fn, allow_extra=allow_extra)
        if self.timeline is not None and bound_s is not None:
            wanted = set(expected)
            mine = [d for d in docs if _key_or_none(fn, d) in wanted]
            self.assert_prompt(mine, fn, bound_s=bound_s, written=written)
        return docs

    def _once_due(self, index: str, expected: list[Hashable], key_fn: Callable[[dict[str, Any]], Hashable],
                  bound_s: float | None) -> list[dict[str, Any]]:
        """Every document, read again while an expected key is missing whose line was written less
        than `bound_s` ago (with a timeline): such a line may still arrive in time, so it is not
        judged lost yet. A test's wait for a count returns early when duplicates count too: in a
        fresh-clone CI run the last write (8 lines, 20 ms old, flush_interval 200 ms) was reported
        missing beside 300 duplicates. At most `bound_s` + 1 s; then the oracle judges what is there."""
        docs = self.all_docs(index)
        timeline = self.timeline
        if timeline is None or bound_s is None:
            return docs
        latest = [docs]

        def young() -> list[Hashable]:
            present = {_key_or_none(key_fn, d) for d in latest[0]}
            return timeline.not_yet_due([k for k in expected if k not in present], bound_s)

        if not young():
            return docs
        give_up = time.monotonic() + bound_s + 1.0

        def settled() -> bool:
            latest[0] = self.all_docs(index)
            return not young() or time.monotonic() > give_up

        wait_until(settled, "the lines written a moment ago", timeout_s=bound_s + 5.0, interval_s=0.2)
        return latest[0]

    def assert_prompt(
        self,
        docs: Iterable[dict[str, Any]],
        key_fn: Callable[[dict[str, Any]], Hashable] | None = None,
        *,
        bound_s: float | None = DEFAULT_BOUND_S,
        written: Mapping[Hashable, float] | Callable[[dict[str, Any]], float] | None = None,
    ) -> None:
        """Each of `docs` arrived within `bound_s` of its write (None: not checked, where the test
        says why)."""
        if self.timeline is None:
            raise AssertionError("this ES client has no promptness timeline (tests/e2e/conftest.py's `es` has one)")
        if bound_s is not None:
            self.timeline.assert_prompt(docs, key_fn, bound_s=bound_s, written=written)


def _key_or_none(key_fn: Callable[[dict[str, Any]], Hashable], doc: dict[str, Any]) -> Hashable:
    try:
        return key_fn(doc)
    except (KeyError, TypeError, IndexError):
        return None


def seq_key(doc: dict[str, Any]) -> Hashable:
    """The default identity of a written line: the pino `seq` field in `_source`."""
    seq: Hashable = doc["_source"]["seq"]
    return seq


def assert_exactly_once(
    docs: Iterable[dict[str, Any]],
    expected_keys: Iterable[Hashable],
    key_fn: Callable[[dict[str, Any]], Hashable] | None = None,
    *,
    allow_extra: bool = False,
    examples: int = 10,
) -> None:
    """Assert each expected key occurs in exactly one of `docs` (hits with `_source`).

    `key_fn(hit)` gives a document's identity (default: `_source.seq`); a KeyError/TypeError
    makes the document unkeyed. Fails listing missing, duplicated and (unless `allow_extra`)
    unexpected or unkeyed documents, with counts and examples; also fails on an `_id` that
    occurs twice (in two indices).
    """
    key_fn = key_fn or seq_key
    expected = list(expected_keys)
    expected_set = set(expected)
    problems: list[str] = []
    if len(expected_set) != len(expected):
        dup_exp = [k for k, n in collections.Counter(expected).items() if n > 1]
        problems.append(f"expected_keys itself repeats {len(dup_exp)} keys, e.g. {sorted(dup_exp, key=repr)[:examples]}")
    seen: dict[Hashable, list[str]] = collections.defaultdict(list)
    unkeyed: list[str] = []
    id_count: collections.Counter[str] = collections.Counter()
    n_docs = 0
    for d in docs:
        n_docs += 1
        id_count[d["_id"]] += 1
        try:
            k = key_fn(d)
        except (KeyError, TypeError, IndexError):
            unkeyed.append(f"{d.get('_index')}/{d['_id']}")
            continue
        seen[k].append(f"{d.get('_index')}/{d['_id']}")
    missing = [k for k in expected_set if k not in seen]
    dups = {k: where for k, where in seen.items() if len(where) > 1}
    extra = [k for k in seen if k not in expected_set]
    dup_ids = [i for i, n in id_count.items() if n > 1]

    def some(keys: Iterable[Hashable]) -> list[Hashable]:
        return sorted(keys, key=repr)[:examples]

    if missing:
        problems.append(f"{len(missing)} missing, e.g. {some(missing)}")
    if dups:
        shown = {k: dups[k] for k in some(dups)}
        problems.append(f"{len(dups)} duplicated ({sum(len(v) - 1 for v in dups.values())} extra docs), e.g. {shown}")
    if dup_ids:
        problems.append(f"{len(dup_ids)} _id values in more than one document, e.g. {some(dup_ids)}")
    if not allow_extra:
        if extra:
            problems.append(f"{len(extra)} unexpected keys, e.g. {some(extra)}")
        if unkeyed:
            problems.append(f"{len(unkeyed)} documents without a key, e.g. {unkeyed[:examples]}")
    if problems:
        raise AssertionError(
            f"exactly-once violated ({len(expected_set)} expected keys, {n_docs} documents): " + "; ".join(problems)
        )
