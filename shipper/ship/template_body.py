"""Pure: the index template `shipper` itself: the distribution a `GET /` names, the patterns covering
the indices a config writes, the template body, and judging the server's templates for `shipper check`.
Must not do I/O: the install, `inspect` and the first-bulk guard are in ship/template.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from shipper.config import Config
from shipper.parse.index import IndexRouter

TEMPLATE_NAME = "shipper"
TEMPLATE_VERSION = 2             # 2: the ECS fields of pino, pino-http and OpenTelemetry (issue 43)
# Elasticsearch's built-in data-stream templates (`logs-*-*` ...) have priority 100. A pattern as
# narrow as one application's (`logs-app-*`, a data stream's own name) goes above them, so its
# daily indices stay plain indices instead of each becoming a data stream; a broad one (`logs-*`)
# goes below, so Elastic Agent's `logs-<dataset>-<namespace>` data streams stay data streams.
PRIORITY_NARROW = 200
PRIORITY_BROAD = 90
_BUILTIN_FAMILIES = ("logs", "metrics", "traces", "synthetics", "profiling")
_SAMPLE_DS = "{}-zz.shipper-probe-zz"      # a name only a broad pattern of that family matches

Product = Literal["elasticsearch", "opensearch", "other"]


# ---------------------------------------------------------------- the distribution

@dataclass(frozen=True, slots=True)
class Distribution:
    """What `GET /` says the destination is."""

    product: Product
    version: tuple[int, ...] = ()
    flavor: str = "default"        # Elasticsearch's build_flavor: default | oss | serverless
    detail: str = ""               # `elasticsearch 8.15.0`, or what answered instead

    @property
    def has_match_only_text(self) -> bool:
        # Elasticsearch 7.14+; OpenSearch has it from 2.12 only, so it gets `text` throughout
        return self.product == "elasticsearch" and self.version >= (7, 14)

    @property
    def has_composable_templates(self) -> bool:
        return self.product == "opensearch" or (self.product == "elasticsearch" and self.version >= (7, 8))


def _version(text: Any) -> tuple[int, ...]:
    if not isinstance(text, str):
        return ()
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def identify(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Distribution:
    """`GET /`'s answer -> the distribution. OpenSearch says so in `version.distribution`;
    Elasticsearch has the tagline "You Know, for Search" (and, from 7.14, `X-Elastic-Product`)."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    if status != 200 or not isinstance(body, dict):
        kind = "HTML page" if isinstance(body, str) and "<" in body[:200] else f"HTTP {status}"
        return Distribution("other", detail=f"not an Elasticsearch answer to GET / ({kind})")
    ver = body.get("version")
    if isinstance(ver, dict) and isinstance(ver.get("number"), str):
        number = ver["number"]
        if str(ver.get("distribution", "")).lower() == "opensearch":
            return Distribution("opensearch", _version(number), "default", f"opensearch {number}")
        tagline = str(body.get("tagline", ""))
        if "You Know, for Search" in tagline or headers.get("x-elastic-product") == "Elasticsearch":
            flavor = str(ver.get("build_flavor") or "default")
            return Distribution("elasticsearch", _version(number), flavor,
                                f"elasticsearch {number}" + (f" ({flavor})" if flavor != "default" else ""))
    if "http_address" in body and "ephemeral_id" in body:
        return Distribution("other", detail="Logstash's monitoring API, not Elasticsearch")
    if "status" in body and "name" in body and "version" in body and "tagline" not in body:
        return Distribution("other", detail=f"{body.get('name')!s} (not Elasticsearch: Kibana?)")
    return Distribution("other", detail="a JSON answer without Elasticsearch's version object")


def unsupported(dist: Distribution) -> str | None:
    """Why no composable template can be installed there, or None."""
    if dist.product == "other":
        return f"the host answers as {dist.detail}"
    if not dist.has_composable_templates:
        return f"{dist.detail} has no composable index templates (Elasticsearch 7.8 or later needed)"
    return None


def is_logsene(cfg: Config) -> bool:
    """Sematext's Logsene receiver: the token is the index and Sematext owns the mapping."""
    return all((urlsplit(h).hostname or "").endswith(".sematext.com") for h in cfg.output.hosts)


# ---------------------------------------------------------------- patterns

_REFUSED_RE = re.compile(r'[\\/?"<>|,#:\s]')
_RUN_RE = re.compile(r"\*(?:[^a-z0-9*]*\*)+")


def index_pattern(index: str) -> str:
    """An index name pattern -> the template pattern covering every name it renders:
    strftime directives and `{field}` references become `*`, and stars separated only by
    punctuation merge (`logs-%Y.%m.%d` -> `logs-*`). Lower-cased like the names themselves."""
    out = re.sub(r"\{[^{}]*\}", "*", index)
    out = re.sub(r"%%|%[-_0^#]?[A-Za-z]", lambda m: "%" if m.group(0) == "%%" else "*", out)
    out = _REFUSED_RE.sub("_", out.lower()).lstrip("-_+")
    return _RUN_RE.sub("*", out) or "*"


def _configured(cfg: Config) -> list[str]:
    return [cfg.output.index, *(inp.index for inp in cfg.inputs if inp.index)]


def index_patterns(cfg: Config) -> tuple[str, ...]:
    """Patterns for every index the config writes: the output's and each input's own. An index
    that begins with a field or a date (`{service}-%Y.%m`) gives `*`, which would apply to every new
    index on the cluster: it is left out (see `uncovered`)."""
    seen: list[str] = []
    for idx in _configured(cfg):
        p = index_pattern(idx)
        if p not in seen and p != "*":
            seen.append(p)
    return tuple(seen)


def uncovered(cfg: Config) -> list[str]:
    """Configured indices no template pattern can cover without matching every index."""
    return [idx for idx in _configured(cfg) if index_pattern(idx) == "*"]


def sample_indices(cfg: Config, now: float) -> list[tuple[str, str]]:
    """(configured pattern, the name it gives now) for every index the config writes."""
    out: list[tuple[str, str]] = []
    for idx in _configured(cfg):
        if idx not in (p for p, _ in out):
            out.append((idx, IndexRouter(idx).route({}, now)))
    return out


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else re.escape(c) for c in pattern) + r"\Z")


def matches(pattern: str, name: str) -> bool:
    """Elasticsearch's index pattern match: `*` is the only wildcard."""
    return _glob(pattern).match(name) is not None


def priority_for(patterns: tuple[str, ...]) -> int:
    broad = any(matches(p, _SAMPLE_DS.format(f)) for p in patterns for f in _BUILTIN_FAMILIES)
    return PRIORITY_BROAD if broad else PRIORITY_NARROW


# ---------------------------------------------------------------- the template

def _kw() -> dict[str, Any]:
    return {"type": "keyword", "ignore_above": 1024}


def _obj(**props: Any) -> dict[str, Any]:
    return {"properties": props}


def _ecs_dynamic(long_: dict[str, Any], text: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("trace.id", _kw()), ("span.id", _kw()), ("transaction.id", _kw()), ("service.name", _kw()),
            ("error.type", _kw()), ("error.message", text), ("error.stack_trace", text),
            ("client.address", _kw()), ("client.port", long_), ("event.duration", long_)]


def build_template(cfg: Config, dist: Distribution) -> dict[str, Any]:
    """The body of `PUT _index_template/shipper` for this config and distribution."""
    patterns = index_patterns(cfg)
    long_ = {"type": "long"}
    text = {"type": "match_only_text"} if dist.has_match_only_text else {"type": "text"}
    mappings: dict[str, Any] = {
        "dynamic_templates": [
            {"kubernetes_as_keyword": {"path_match": "kubernetes.*", "match_mapping_type": "string", "mapping": _kw()}},
            {"container_as_keyword": {"path_match": "container.*", "match_mapping_type": "string", "mapping": _kw()}},
            # the ECS fields of pino lines (parse/ecs.py) under objects an application's own lines
            # often hold as plain values (`"event": "login"`, `"error": "boom"`): typed when they
            # appear, so such a line still indexes where no ECS field of that object came first
            *({f"ecs_{path.replace('.', '_')}": {"path_match": path, "mapping": m}}
              for path, m in _ecs_dynamic(long_, text)),
            # like Beats: other strings are keywords (aggregations, exact filters), `message` is the text
            {"strings_as_keyword": {"match_mapping_type": "string", "mapping": _kw()}},
        ],
        "properties": {
            "@timestamp": {"type": "date"},
            "message": text,
            "log": _obj(level=_kw(), file=_obj(path=_kw()), offset=long_, flags=_kw(), stream=_kw(),
                        original_timestamp=_kw(),
                        syslog=_obj(priority=long_, facility=_obj(code=long_), severity=_obj(code=long_))),
            "host": _obj(name=_kw(), hostname=_kw()),
            "systemd": _obj(unit=_kw()),
            "process": _obj(pid=long_, name=_kw()),
            "kubernetes": _obj(namespace=_kw(), pod=_obj(name=_kw())),
            "container": _obj(name=_kw(), id=_kw()),
            "http": _obj(request=_obj(id=_kw(), method=_kw(), referrer=_kw()), version=_kw(),
                         response=_obj(status_code=long_, body=_obj(bytes=long_))),
            "url": _obj(original=_kw(), path=_kw(), query=_kw()),
            "source": _obj(address=_kw()),
            "user": _obj(name=_kw()),
            "user_agent": _obj(original=_kw()),
        },
    }
    template: dict[str, Any] = {"mappings": mappings}
    if dist.flavor != "serverless":
        # JSON application logs bring many fields; serverless projects manage this limit themselves
        template["settings"] = {"index": {"mapping": {"total_fields": {"limit": 10000}}}}
    body: dict[str, Any] = {
        "index_patterns": list(patterns),
        "priority": priority_for(patterns),
        "version": TEMPLATE_VERSION,
        "template": template,
        "_meta": {"managed_by": "shipper", "description": "installed by shipper (index_template: auto); "
                                                          "edit freely, shipper leaves an existing one alone"},
    }
    if cfg.output.data_stream is not None:
        body["data_stream"] = {}
    return body

# ---------------------------------------------------------------- judging (shipper check)

@dataclass(frozen=True, slots=True)
class ServerTemplate:
    name: str
    patterns: tuple[str, ...]
    priority: int
    data_stream: bool


def parse_templates(body: Any) -> list[ServerTemplate]:
    """`GET _index_template` -> the composable templates."""
    out: list[ServerTemplate] = []
    if not isinstance(body, dict):
        return out
    for t in body.get("index_templates") or []:
        it = t.get("index_template") if isinstance(t, dict) else None
        if not isinstance(it, dict):
            continue
        pats = it.get("index_patterns") or []
        if isinstance(pats, str):
            pats = [pats]
        prio = it.get("priority")
        out.append(ServerTemplate(str(t.get("name")), tuple(str(p) for p in pats),
                                  int(prio) if isinstance(prio, (int, str)) and str(prio).lstrip("-").isdigit() else 0,
                                  it.get("data_stream") is not None))
    return out


@dataclass(frozen=True, slots=True)
class Finding:
    ok: bool
    text: str


@dataclass(frozen=True, slots=True)
class Inspection:
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


def winner(name: str, templates: list[ServerTemplate]) -> ServerTemplate | None:
    """The composable template Elasticsearch would apply when `name` is created (highest priority)."""
    best: ServerTemplate | None = None
    for t in templates:
        if any(matches(p, name) for p in t.patterns) and (best is None or t.priority > best.priority):
            best = t
    return best


def judge_indices(cfg: Config, templates: list[ServerTemplate], now: float) -> list[Finding]:
    """For each index the config writes: which template it gets, and the traps (no template, a
    data-stream template on a plain index, a plain template on a data stream, another template
    overriding shipper's)."""
    out: list[Finding] = []
    wants_ds = cfg.output.data_stream is not None
    for configured, name in sample_indices(cfg, now):
        w = winner(name, templates)
        if w is None:
            out.append(Finding(False, f"index {name} ({configured}): no index template matches it: Elasticsearch "
                                      "will guess the mappings (log.level as text); set index_template: auto or run "
                                      "`shipper template`"))
        elif w.data_stream and not wants_ds:
            out.append(Finding(False, f"index {name} ({configured}) matches the data-stream template {w.name} "
                                      f"(patterns {', '.join(w.patterns)}, priority {w.priority}): every name it "
                                      "renders becomes a new data stream; use output.elasticsearch.data_stream, or an "
                                      "index name outside those patterns"))
        elif wants_ds and not w.data_stream:
            out.append(Finding(False, f"data stream {name} matches template {w.name} without data_stream: it would "
                                      "be created as a plain index"))
        elif w.name != TEMPLATE_NAME and cfg.output.index_template == "auto":
            out.append(Finding(False, f"index {name} ({configured}) gets template {w.name} (priority {w.priority}), "
                                      f"not {TEMPLATE_NAME}: its mappings apply"))
        else:
            out.append(Finding(True, f"index {name} ({configured}): template {w.name}"
                                     + (" (data stream)" if w.data_stream else "")))
    return out
