"""Installing the index template `shipper` before the first bulk request, and `shipper check`'s look at
the server's templates: the I/O, through `BulkClient.request`; what the template holds and every pure
decision are template_body.py's. A destination that refuses templates gets one warning and shipping
goes on; only an output that gives no answer at all holds the first bulk back."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from shipper.config import Config
from shipper.errors import TransportError
from shipper.ship.client import Answer, BulkClient
from shipper.ship.template_body import (
    TEMPLATE_NAME,
    Distribution,
    Finding,
    Inspection,
    ServerTemplate,
    build_template,
    identify,
    index_patterns,
    is_logsene,
    judge_indices,
    matches,
    parse_templates,
    uncovered,
    unsupported,
)

log = logging.getLogger("shipper.output")

TemplateState = Literal["installed", "replaced", "exists", "refused", "unavailable", "skipped"]


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
        dist = res.distribution.detail if res.distribution else None
        if res.state == "exists":
            # someone's template of that name, left alone: said as `shipper check` says it when it
            # does not cover what this config writes (those indices get the destination's guesses)
            theirs = [str(p) for p in (res.template or {}).get("index_patterns") or []]
            missing = [p for p in res.patterns if not any(_covers(op, p) for op in theirs)]
            if missing:
                log.warning("index template exists but does not cover the indices written (`shipper template --force`)",
                            extra={"template": TEMPLATE_NAME, "patterns": theirs, "not_covered": missing,
                                   "distribution": dist})
                return
            log.info("index template already there", extra={"template": TEMPLATE_NAME, "patterns": theirs,
                                                             "distribution": dist})
            return
        log.info("index template installed", extra={"template": TEMPLATE_NAME, "patterns": list(res.patterns),
                                                     "distribution": dist})


def guard_first_bulk(client: BulkClient, cfg: Config) -> TemplateGate | None:
    """With `index_template: auto`, install the template before `client`'s first bulk request.
    The service calls this on each new pipeline's client (start and reload)."""
    if cfg.output.index_template != "auto":
        return None
    gate = TemplateGate(cfg)
    client.preflight = gate
    return gate



async def inspect(client: BulkClient, cfg: Config, now: float) -> Inspection:
    """`shipper check`'s template part: the distribution of every host, whether `shipper` is
    installed and covers the indices, and the traps. Makes no change on the server."""
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
