"""Events -> Elasticsearch documents per SPEC, as bulk `create` pairs: `DocBuilder`, one input's
facade over its shaper (shaper.py: what a document holds), its pair bytes (pair_bytes.py), the
build loops (doc_splice.py, container_doc.py, the C splice of _native.c) and its processors.
Pure; bad input is flagged in `log.flags`, never raised. The `_id` is `<incarnation>-<offset>`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from shipper import native
from shipper.config import InputConfig
from shipper.model import Line, SplitBuild
from shipper.parse.doc_splice import build_as_text, build_general, build_reserialised, build_source
from shipper.parse.doc_values import FAST_MS_MAX, FAST_MS_MIN, SourceEvent, index_field_refs
from shipper.parse.ecs import ROOTS as ECS_ROOTS
from shipper.parse.ecs import SOURCE_KEYS as ECS_SOURCE_KEYS
from shipper.parse.ecs import root_mask
from shipper.parse.index import IndexRouter
from shipper.parse.pair_bytes import PairBytes
from shipper.parse.processors import Processors
from shipper.parse.shaper import DocShaper

if TYPE_CHECKING:
    from shipper.parse.container import ContainerEvent
    from shipper.parse.container_doc import ContainerDocs

native_splice = native.splice      # the C fast path, or None (shipper/native.py); tests replace it
native_split_splice = native.split_splice   # the same, fused with line splitting (split_builder)

# The keys enrichment adds or overwrites at the top level: a JSON line with none of them (nor the
# input's fields) is spliced (see DocBuilder._build); one with any of them is re-serialised.
_ADDED_KEYS = frozenset(("@timestamp", "log", "host", "message"))
_SPLICE_BLOCKERS = frozenset(("@timestamp", "log", "host"))
_ECS_CODE = {"off": 0, "add": 1, "replace": 2}     # the C path's `ecs` argument
MAX_RESERVED = 64                                  # the C scan's limit on reserved keys


class DocBuilder:
    """Builds the bulk pairs for one input. `splice` and `split_splice` are the C loops it uses
    (None: the Python ones); tests and fuzzers set them to hold both paths to the same documents."""

    def __init__(self, inp: InputConfig, default_index: str, host_name: str) -> None:
        self.shaper = DocShaper(inp, host_name)
        self.format = inp.format
        self.router = IndexRouter(inp.index or default_index)
        self.splice_reserved = self._splice_keys(inp)
        fields_bytes = b""
        if self.splice_reserved is not None and self.shaper.fields:
            try:
                fields_bytes = b"".join(b"," + orjson.dumps(k) + b":" + orjson.dumps(v)
                                        for k, v in self.shaper.fields.items())
            except (TypeError, orjson.JSONEncodeError):
                self.splice_reserved = None      # not serialisable on its own: the slow path says how
        self.pairs = PairBytes(self.router, host_name, fields_bytes, self.splice_reserved,
                               (_ECS_CODE[inp.ecs], root_mask(self.shaper.ecs_fixed)))
        procs = Processors(inp)
        self.processors = procs if procs.active else None
        self.drop_reasons = (("include_lines",) if inp.include_lines else ()) + (
            ("exclude_lines",) if inp.exclude_lines else ()) + procs.reasons
        # the C fast path: for the usual input (no line filter; an index named by neither a field
        # nor anything but the event time), when it is built
        self.splice: native.Splice | None = (
            native_splice if native_splice is not None and self.splice_reserved is not None
            and self.shaper.line_filter is None and "{" not in self.router.pattern
            and len(self.pairs.reserved_bytes) <= MAX_RESERVED else None)
        # the fused loop appends runs of pairs as one bytes object: not with processors, which
        # drop or rewrite pairs one by one
        self.split_splice: native.SplitSplice | None = (
            native_split_splice if self.splice is not None and self.processors is None else None)
        self._containers: ContainerDocs | None = None

    @property
    def fusable(self) -> bool:
        """Does `split_builder` give a fused loop (the C path, built)?"""
        return self.split_splice is not None

    @property
    def dropped(self) -> dict[str, int]:
        """The events dropped since `take_dropped`, by reason."""
        return self.shaper.dropped

    def take_dropped(self) -> dict[str, int]:
        """The events dropped since the last call, by reason (`shipper_events_dropped_total`)."""
        return self.shaper.take_dropped()

    def _splice_keys(self, inp: InputConfig) -> frozenset[str] | None:
        """The top-level keys that send a JSON line to full re-serialisation; None: never splice.

        Splicing needs JSON input, no transform (it rewrites the doc), input fields that touch
        nothing enrichment adds, and an index pattern that reads no added field."""
        shaper = self.shaper
        if shaper.line_format not in ("auto", "json") or shaper.transform is not None:
            return None
        if not all(isinstance(k, str) for k in shaper.fields):
            return None
        field_keys = frozenset(shaper.fields)
        if field_keys & _ADDED_KEYS:
            return None
        # what the index pattern may not read: the keys enrichment adds, the ECS objects the mapping
        # writes, and (replace) the sources it removes; a splice routes on the line, not the document
        touched = _ADDED_KEYS | field_keys
        if inp.ecs != "off":
            touched |= ECS_ROOTS
        if inp.ecs == "replace":
            touched |= ECS_SOURCE_KEYS
        for ref in index_field_refs(self.router.pattern):
            if any(ref.startswith(k) for k in touched):
                return None
        return _SPLICE_BLOCKERS | field_keys

    def to_doc(self, data: bytes, flags: int, path: str, offset: int, now: float,
               parsed: dict[str, Any] | None = None, *, as_text: bool = False) -> tuple[dict[str, Any], float] | None:
        """One line of a file -> (document, event time), as `DocShaper.to_doc`."""
        return self.shaper.to_doc(data, flags, path, offset, now, parsed, as_text=as_text)

    def source_doc(self, ev: SourceEvent, *, as_text: bool = False) -> tuple[dict[str, Any], float] | None:
        """An event of a non-file source -> (document, event time), as `DocShaper.source_doc`."""
        return self.shaper.source_doc(ev, as_text=as_text)

    def build_source(self, events: list[SourceEvent], out: list[bytes], now: float) -> int:
        """Append one bulk pair per event of a non-file source to `out` (each with its own `_id`),
        but the ones the processors drop; returns the bytes appended. `now`: when they were read
        (the throttle's clock)."""
        n0 = len(out)
        return self._processed(out, n0, build_source(self.shaper, self.pairs, events, out), now)

    @property
    def containers(self) -> ContainerDocs:
        if self._containers is None:
            from shipper.parse.container_doc import ContainerDocs
            self._containers = ContainerDocs(self.shaper, self.pairs, self.splice_reserved, self.router.pattern,
                                             self.splice, self.build_pairs)
        return self._containers

    def build_container(self, incarnation: str, path: str, events: list[ContainerEvent], now: float,
                        out: list[bytes]) -> int:
        """Append one bulk pair per joined container record (`parse/container.py`) to `out`;
        returns the bytes appended. `now` is the time the lines were read; the runtime's time
        (RFC 3339 text) is the fallback @timestamp of records without their own
        (`parse/container_doc.py`). The processors drop or rewrite pairs as in `build`."""
        n0 = len(out)
        return self._processed(out, n0, self.containers.build(incarnation, path, events, now, out), now)

    def _processed(self, out: list[bytes], n0: int, nbytes: int, now: float) -> int:
        """The input's processors over the pairs just appended (out[n0:]); the bytes left."""
        if self.processors is None or len(out) == n0:
            return nbytes
        return self.processors.filter(out, n0, now, self.shaper.dropped)

    def build(self, incarnation: str, path: str, events: list[Line], now: float,
              out: list[bytes]) -> int:
        """Append one bulk pair per event to `out`, but the ones the input's processors drop;
        returns the bytes appended (`build_pairs`, then `parse/processors.py`). `now` is the time
        the lines were read."""
        n0 = len(out)
        return self._processed(out, n0, self.build_pairs(incarnation, path, events, now, out), now)

    def build_pairs(self, incarnation: str, path: str, events: list[Line], now: float,
                    out: list[bytes]) -> int:
        """`build` without the processors (see `_build`).

        Bad input never stops the pipeline: orjson parses JSON nested up to 1024 levels but
        serialises only 255, so such a line raises TypeError; then the events are built one by one
        and that line goes as text, flagged json_parse_failed.
        """
        n0 = len(out)
        counted = dict(self.shaper.dropped)
        try:
            return self._build(incarnation, path, events, now, out)
        except TypeError:
            del out[n0:]
            self.shaper.dropped = counted       # the lines the first try dropped are dropped again below
        nbytes = 0
        for ev in events:
            try:
                nbytes += self._build(incarnation, path, [ev], now, out)
                continue
            except TypeError:
                pass
            nbytes += build_as_text(self.shaper, self.pairs, incarnation, path, ev, now, out)
        return nbytes

    def split_builder(self, incarnation: str, path: str, now: float, out: list[bytes], counts: dict[int, int],
                      sniff: Callable[[bytes, bytes], bool] | None = None) -> SplitBuild | None:
        """`build` fused with line splitting, for one file's batch (`LineSplitter.feed_built`): the
        C loop scans each line where it was read and appends the pairs to `out`, so a line it takes
        never becomes a Python object (`_native.split_splice`); consecutive ones share one bytes
        object, `counts[i]` pairs in `out[i]` (`Draft.multi`). Every line gets the document `build`
        gives it, in order. None where `build` would not take the C path. `sniff(first, last)`
        (format auto) sees the first and last line of each chunk first; true: the caller splits
        and builds that chunk itself (a container log)."""
        fused = self.split_splice
        if fused is None:
            return None
        shaper, pb = self.shaper, self.pairs

        def one(ev: Line) -> int:
            # a line the scan did not take: what `build` gives it alone (TypeError: as text)
            n0 = len(out)
            try:
                return self.build_general(incarnation, path, [ev], now, out)
            except TypeError:
                del out[n0:]
            return build_as_text(shaper, pb, incarnation, path, ev, now, out)

        rest = (out, counts, pb.static_prefix, pb.prefix_at_second, incarnation.encode() + b"-", pb.path(path),
                pb.host, pb.tail, pb.reserved_bytes, one, FAST_MS_MIN, FAST_MS_MAX, pb.ecs_arg)

        def split(chunk: Any, carry: bytes, pos: int, limit: int, flag: int) -> tuple[int, int, int, int, int, int, int] | None:
            return fused(chunk, carry, pos, limit, flag, sniff, *rest)

        return split

    def _build(self, incarnation: str, path: str, events: list[Line], now: float,
               out: list[bytes]) -> int:
        """Append one bulk pair per event to `out`; returns the bytes appended.

        A JSON object line with none of the keys enrichment adds (`@timestamp`, `log`, `host`,
        the input's fields; `message` only when it would be copied from `msg`) is spliced:
        `{` + the added fields as ready bytes + `,` + orjson's serialisation of the parsed line
        without its `{`. The parsed dict is never modified and nothing is serialised twice.
        Why not the original line's bytes: proving it has no duplicate keys (which Elasticsearch
        rejects, while re-serialising keeps the last) costs more than orjson.dumps does. Every
        other line takes the general path (`to_doc` + a full serialisation); both give equal docs.
        """
        if self.splice_reserved is None:
            return build_reserialised(self.shaper, self.pairs, incarnation, path, events, now, out)
        if self.splice is not None:
            return self.build_native(incarnation, path, events, now, out)
        return build_general(self.shaper, self.pairs, incarnation, path, events, now, out)

    def build_native(self, incarnation: str, path: str, events: list[Line], now: float,
                     out: list[bytes]) -> int:
        """`_build` in C (`_native.c`): a valid pino line is passed through as it is, after the
        added fields; every line it does not take is handed, in order, to the Python loop."""
        pb = self.pairs

        def one(ev: Line) -> int:
            return self.build_general(incarnation, path, [ev], now, out)

        splice = self.splice
        assert splice is not None
        return splice(events, out, pb.static_prefix, pb.prefix_at_second, incarnation.encode() + b"-", pb.path(path),
                      pb.host, pb.tail, pb.reserved_bytes, one, FAST_MS_MIN, FAST_MS_MAX, pb.ecs_arg)

    def build_general(self, incarnation: str, path: str, events: list[Line], now: float,
                      out: list[bytes]) -> int:
        """The Python splice loop (`doc_splice.build_general`), for any index pattern and line
        filter; the C loops hand it each line they do not take, through this method."""
        return build_general(self.shaper, self.pairs, incarnation, path, events, now, out)

    def build_reserialised(self, incarnation: str, path: str, events: list[Line], now: float,
                           out: list[bytes]) -> int:
        """`build` without splicing: every event through `to_doc` and one full serialisation."""
        return build_reserialised(self.shaper, self.pairs, incarnation, path, events, now, out)
