"""The index template `shipper`: what it holds for the distribution at hand, which indices it covers,
installing it before the first bulk request, and judging the server's templates for `shipper check`.

Pure decisions (`identify`, `index_patterns`, `build_template`, `judge_indices`) are apart from the
I/O (`ensure_templates`, `inspect`, `TemplateGate`), which goes through `BulkClient.request`.
A destination that refuses templates (Logsene, a key without `manage_index_templates`) gets one
warning and shipping goes on; only an output that gives no answer at all holds the first bulk back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from shipper.config import Config
from shipper.errors import TransportError
from shipper.parse.index import IndexRouter
from shipper.ship.client import Answer, BulkClient

log = logging.getLogger("shipper.output")

TEMPLATE_NAME = "shipper"
TEMPLATE_VERSION = 1
# Elasticsearch's built-in data-stream templates (`logs-*-*` ...) have priority 100. A pattern as
# narrow as one application's (`logs-app-*`, a data stream's own name) goes above them, so its
# daily indices stay plain indices instead of each becoming a data stream; a broad one (`logs-*`)
# goes below, so Elastic Agent's `logs-<dataset>-<namespace>` data streams stay data streams.
PRIORITY_NARROW = 200
PRIORITY_BROAD = 90
_BUILTIN_FAMILIES = ("logs", "metrics", "traces", "synthetics", "profiling")
_SAMPLE_DS = "{}-zz.shipper-probe-zz"      # a name only a broad pattern of that family matches

Product = Literal["elasticsearch", "opensearch", "other"]
TemplateState = Literal["installed", "replaced", "exists", "refused", "unavailable", "skipped"]


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


def build_template(cfg: Config, dist: Distribution) -> dict[str, Any]:
    """The body of `PUT _index_template/shipper` for this config and distribution."""
    patterns = index_patterns(cfg)
    long_ = {"type": "long"}
    text = {"type": "match_only_text"} if dist.has_match_only_text else {"type": "text"}
    mappings: dict[str, Any] = {
        "dynamic_templates": [
            {"kubernetes_as_keyword": {"path_match": "kubernetes.*", "match_mapping_type": "string", "mapping": _kw()}},
            {"container_as_keyword": {"path_match": "container.*", "match_mapping_type": "string", "mapping": _kw()}},
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
            "http": _obj(request=_obj(method=_kw(), referrer=_kw()), version=_kw(),
                         response=_obj(status_code=long_, body=_obj(bytes=long_))),
            "url": _obj(original=_kw()),
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


# ---------------------------------------------------------------- installing

@dataclass(frozen=True, slots=True)
class TemplateResult:
    state: TemplateState
    detail: str
    patterns: tuple[str, ...] = ()
    distribution: Distribution | None = None
    template: dict[str, Any] | None = None      # the body sent, or the one found
    answered: bool = True                       # False: no HTTP answer came (unreachable, timeout, TLS)


def _reason(ans: Answer) -> str:
    err = ans.body.get("error") if isinstance(ans.body, dict) else None
    if isinstance(err, dict):
        return f"HTTP {ans.status} {err.get('type', 'error')}: {err.get('reason', '')}"
    return f"HTTP {ans.status}"


def _privilege_hint(status: int) -> str:
    if status == 401:
        return " (the credentials were not accepted)"
    if status == 403:
        return " (the user or API key needs the manage_index_templates cluster privilege)"
    return ""


async def distribution(client: BulkClient) -> Distribution | TemplateResult:
    """GET / -> the distribution, or the result that ends the template step."""
    try:
        ans = await client.request("GET", "/")
    except TransportError as e:
        return TemplateResult("unavailable", f"{e.host}: {e}", answered=False)
    if ans.status in (401, 403):
        return TemplateResult("refused", f"GET / answered {_reason(ans)}"
                              + (" (the user or API key needs the monitor cluster privilege)" if ans.status == 403
                                 else " (the credentials were not accepted)"))
    if ans.status == 429 or ans.status >= 500:
        return TemplateResult("unavailable", f"GET / answered {_reason(ans)}")
    return identify(ans.status, ans.body, ans.headers)


async def ensure_templates(client: BulkClient, cfg: Config, *, force: bool = False) -> TemplateResult:
    """Make sure `shipper` covers the indices the config writes: installed unless one of that name
    exists (`force`: replaced). One attempt; `unavailable` means worth trying again later."""
    patterns = index_patterns(cfg)
    if not patterns:
        return TemplateResult("refused", f"no index pattern can cover {', '.join(uncovered(cfg))} without "
                                         "matching every index: give it a fixed prefix (app-{service}-%Y.%m)")
    dist = await distribution(client)
    if isinstance(dist, TemplateResult):
        return TemplateResult(dist.state, dist.detail, patterns, answered=dist.answered)
    why = unsupported(dist)
    if why is not None:
        return TemplateResult("refused", why, patterns, dist)
    path = f"/_index_template/{TEMPLATE_NAME}"
    existed = False
    try:
        ans = await client.request("GET", path)
        if ans.status == 200:
            found = _found_template(ans.body)
            if not force:
                return TemplateResult("exists", f"index template {TEMPLATE_NAME} exists, left alone "
                                      f"(patterns {', '.join(found.get('index_patterns', []) or ['?'])})",
                                      patterns, dist, found)
            existed = True
        elif ans.status == 429 or ans.status >= 500:
            return TemplateResult("unavailable", f"GET {path} answered {_reason(ans)}", patterns, dist)
        elif ans.status != 404:
            return TemplateResult("refused", f"GET {path} answered {_reason(ans)}{_privilege_hint(ans.status)}",
                                  patterns, dist)
        body = build_template(cfg, dist)
        ans = await client.request("PUT", path, body)
    except TransportError as e:
        return TemplateResult("unavailable", f"{e.host}: {e}", patterns, dist, answered=False)
    if 200 <= ans.status < 300:
        state: TemplateState = "replaced" if existed else "installed"
        return TemplateResult(state, f"index template {TEMPLATE_NAME} {state} for {', '.join(patterns)} "
                              f"({dist.detail})", patterns, dist, body)
    if ans.status == 429 or ans.status >= 500:
        return TemplateResult("unavailable", f"PUT {path} answered {_reason(ans)}", patterns, dist, body)
    return TemplateResult("refused", f"PUT {path} answered {_reason(ans)}{_privilege_hint(ans.status)}",
                          patterns, dist, body)


def _found_template(body: Any) -> dict[str, Any]:
    if isinstance(body, dict):
        for t in body.get("index_templates") or []:
            if isinstance(t, dict) and t.get("name") == TEMPLATE_NAME and isinstance(t.get("index_template"), dict):
                return t["index_template"]  # type: ignore[no-any-return]
    return {}


class TemplateGate:
    """`BulkClient.preflight` for `index_template: auto`: runs `ensure_templates` before the first
    bulk request. No answer at all raises TransportError (the bulk could not go either: the sender
    backs off and tries again); after `max_busy` 429/5xx answers it gives up; a refusal is one
    warning and shipping goes on with the destination's own mappings."""

    def __init__(self, cfg: Config, max_busy: int = 3) -> None:
        self.cfg = cfg
        self.max_busy = max_busy
        self.busy = 0
        self.result: TemplateResult | None = None

    async def __call__(self, client: BulkClient) -> None:
        if is_logsene(self.cfg):
            self.result = TemplateResult("skipped", "the Logsene receiver manages the mapping")
            log.debug("index template skipped", extra={"reason": self.result.detail})
            return
        if self.busy >= self.max_busy:
            # decided before asking again, so every busy answer was followed by a retry (the metric counts them)
            assert self.result is not None
            log.warning("index template not installed: the destination stayed busy; shipping goes on",
                        extra={"reason": self.result.detail, "template": TEMPLATE_NAME})
            return
        res = await ensure_templates(client, self.cfg)
        self.result = res
        if res.state == "unavailable":
            if res.answered:
                self.busy += 1
            raise TransportError(f"index template: {res.detail}", host=client.hosts[0].label)
        if res.state == "refused":
            log.warning("index template not installed: the destination refused it; shipping goes on "
                        "with its own mappings", extra={"reason": res.detail, "template": TEMPLATE_NAME})
            return
        log.info("index template " + ("installed" if res.state in ("installed", "replaced") else "already there"),
                 extra={"template": TEMPLATE_NAME, "patterns": list(res.patterns),
                        "distribution": res.distribution.detail if res.distribution else None})


def guard_first_bulk(client: BulkClient, cfg: Config) -> TemplateGate | None:
    """With `index_template: auto`, install the template before `client`'s first bulk request.
    The service calls this on each new pipeline's client (start and reload)."""
    if cfg.output.index_template != "auto":
        return None
    gate = TemplateGate(cfg)
    client.preflight = gate
    return gate


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


async def inspect(client: BulkClient, cfg: Config, now: float | None = None) -> Inspection:
    """`shipper check`'s template part: the distribution of every host, whether `shipper` is
    installed and covers the indices, and the traps. Makes no change on the server."""
    now = time.time() if now is None else now
    findings: list[Finding] = []
    if is_logsene(cfg):
        return Inspection([Finding(True, "template: skipped (the Logsene receiver manages the mapping)")])
    dists: dict[str, Distribution] = {}
    for h in client.hosts:
        try:
            ans = await client.request("GET", "/", host=h)
        except TransportError:
            continue                       # the host lines of `check` already say it is down
        d = identify(ans.status, ans.body, ans.headers)
        if ans.status in (401, 403):
            continue
        dists[h.label] = d
        if d.product == "other":
            findings.append(Finding(False, f"host {h.label}: answers as {d.detail}"))
    products = {d.product for d in dists.values() if d.product != "other"}
    if len(products) > 1:
        findings.append(Finding(False, "hosts answer as different products: "
                                + ", ".join(f"{h} {d.detail}" for h, d in dists.items())))
    usable = [d for d in dists.values() if d.product != "other"]
    if not usable:
        return Inspection(findings)
    dist = usable[0]
    try:
        ans = await client.request("GET", "/_index_template")
    except TransportError as e:
        return Inspection(findings + [Finding(False, f"templates: cannot list the index templates: {e}")])
    if ans.status != 200:
        return Inspection(findings + [Finding(False, f"templates: GET /_index_template answered {_reason(ans)}"
                                                     f"{_privilege_hint(ans.status)}")])
    templates = parse_templates(ans.body)
    ours = next((t for t in templates if t.name == TEMPLATE_NAME), None)
    patterns = index_patterns(cfg)
    if ours is not None:
        missing = [p for p in patterns if not any(_covers(op, p) for op in ours.patterns)]
        if missing:
            findings.append(Finding(False, f"template {TEMPLATE_NAME}: installed, but its patterns "
                                           f"({', '.join(ours.patterns)}) do not cover {', '.join(missing)}; "
                                           "`shipper template --force` rewrites it for this config"))
        else:
            findings.append(Finding(True, f"template {TEMPLATE_NAME}: installed ({', '.join(ours.patterns)}, "
                                          f"priority {ours.priority})"))
    elif cfg.output.index_template == "auto":
        why = unsupported(dist)
        if why is None and not patterns:
            why = f"no pattern covers {', '.join(uncovered(cfg))} without matching every index"
        if why is not None:
            findings.append(Finding(False, f"template {TEMPLATE_NAME}: cannot be installed: {why}"))
        else:
            body = build_template(cfg, dist)
            templates = templates + [ServerTemplate(TEMPLATE_NAME, tuple(body["index_patterns"]), body["priority"],
                                                    "data_stream" in body)]
            findings.append(Finding(True, f"template {TEMPLATE_NAME}: not installed yet; `shipper run` installs it "
                                          f"before the first bulk request ({', '.join(patterns)}, {dist.detail})"))
    else:
        findings.append(Finding(True, f"template {TEMPLATE_NAME}: not installed (index_template: off)"))
    return Inspection(findings + judge_indices(cfg, templates, now))


def _covers(template_pattern: str, pattern: str) -> bool:
    """Whether every name `pattern` matches is matched by `template_pattern` (stars as text: a safe
    approximation for the patterns shipper derives)."""
    return matches(template_pattern, pattern)
