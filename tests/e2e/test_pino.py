"""Lines the real pino, pino-http and @opentelemetry/instrumentation-pino write (tests/fixtures/pino/
app.js, under Node.js, serving requests to itself on loopback) arrive in the index with the ECS
fields Kibana reads, each line exactly once and promptly, with `ecs: add` (the default) and
`ecs: replace`. Skipped, saying why, where this machine has no Node.js or npm cannot fetch the
pinned packages; tests/unit/test_ecs.py holds the recorded lines of the same app to the same
fields everywhere."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import REPO_ROOT, write_config
from tests.support.es import ES
from tests.support.promptness import Timeline
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "pino"
NODE_DIR = REPO_ROOT / "build" / "pino-node"     # npm ci's node_modules, kept between runs
INDEX = "pino"


def node_app() -> Path:
    """app.js beside its pinned node_modules (npm ci once, again when the lock file changes)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("no Node.js here (node and npm): the real pino lines are not generated; "
                    "tests/unit/test_ecs.py checks the recorded ones (tests/fixtures/pino/lines.ndjson)")
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    lock = NODE_DIR / "package-lock.json"
    fresh = lock.exists() and filecmp.cmp(lock, FIXTURE / "package-lock.json", shallow=False) \
        and (NODE_DIR / "node_modules" / "pino-http").is_dir()
    for name in ("package.json", "package-lock.json", "app.js"):
        shutil.copyfile(FIXTURE / name, NODE_DIR / name)
    if not fresh:
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            pytest.skip(f"npm ci could not install the pinned pino packages (no registry?): {done.stderr[-500:]}")
    return NODE_DIR / "app.js"


def run_app(app: Path, log: Path, timeline: Timeline) -> list[dict[str, Any]]:
    """Run the app once (it appends its lines to `log`); the lines it wrote, each with its offset.
    Their write time for the oracle is when the app ended (a little late: lenient by its run)."""
    start = log.stat().st_size if log.exists() else 0
    subprocess.run(["node", str(app), str(log)], check=True, timeout=120, capture_output=True)
    data = log.read_bytes()[start:]
    lines, pos = [], start
    for raw in data.splitlines(keepends=True):
        lines.append(dict(json.loads(raw), _offset=pos))
        pos += len(raw)
    timeline.wrote([ln["_offset"] for ln in lines])
    return lines


def offset_key(doc: dict[str, Any]) -> int:
    return int(doc["_source"]["log"]["offset"])


def get(src: dict[str, Any], dotted: str) -> Any:
    v: Any = src
    for k in dotted.split("."):
        v = v[k]
    return v


@pytest.mark.parametrize("mode", ["add", "replace"])
def test_real_pino_http_lines_arrive_with_the_ecs_fields(tmp_path: Path, es: ES, osmem_clone: Any,
                                                         daemon_factory: Any, timeline: Timeline, mode: str) -> None:
    app = node_app()
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    cfg = write_config(tmp_path, es_url=osmem_clone.url, paths=[log],
                       input_extra={} if mode == "add" else {"ecs": "replace"},
                       extra_yaml={"output": {"elasticsearch": {"index": INDEX}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    lines = run_app(app, log, timeline)                       # written while the daemon runs
    lines += run_app(app, log, timeline)
    wait_until(lambda: es.count(INDEX) >= len(lines), lambda: f"{len(lines)} documents (have {es.count(INDEX)})")
    docs = es.assert_exactly_once([ln["_offset"] for ln in lines], offset_key, index=INDEX)
    by_offset = {offset_key(h): h["_source"] for h in docs}
    completed = [ln for ln in lines if ln["msg"] == "request completed"]
    assert len(completed) == 6 and any("?" in ln["req"]["url"] for ln in completed)
    for ln in completed:
        src = by_offset[ln["_offset"]]
        path, _, query = ln["req"]["url"].partition("?")
        want: dict[str, Any] = {
            "trace.id": ln["trace_id"], "span.id": ln["span_id"], "process.pid": ln["pid"],
            "host.hostname": ln["hostname"], "service.name": "checkout", "http.request.id": str(ln["req"]["id"]),
            "http.request.method": "GET", "url.original": ln["req"]["url"], "url.path": path,
            "client.address": ln["req"]["remoteAddress"], "client.port": ln["req"]["remotePort"],
            "user_agent.original": ln["req"]["headers"]["user-agent"],
            "http.response.status_code": ln["res"]["statusCode"], "event.duration": round(float(ln["responseTime"]) * 1e6),
            "message": "request completed", "log.level": "info",
        }
        if query:
            want["url.query"] = query
        for field, value in want.items():
            got = get(src, field)
            assert got == value and type(got) is type(value), (field, got, value)
        if mode == "add":
            assert src["req"]["url"] == ln["req"]["url"] and src["trace_id"] == ln["trace_id"]
        else:
            assert "trace_id" not in src and "pid" not in src and "url" not in src["req"]
            assert src["time"] == ln["time"] and src["msg"] == ln["msg"]
    (failed, *_) = [ln for ln in lines if ln["msg"] == "payment failed"]
    src = by_offset[failed["_offset"]]
    assert src["error"]["type"] == "Error" and src["error"]["message"] == "card declined"
    assert src["error"]["stack_trace"].startswith("Error: card declined\n    at ")
    assert src["trace"]["id"] == failed["trace_id"] and src["log"]["level"] == "error"
    late = by_offset[[ln for ln in lines if ln["msg"] == "report is late"][0]["_offset"]]
    assert late["trace"]["id"] and late["span"]["id"] and "http" not in late      # the app's own span
    assert d.status_json()["files"][0]["lag_bytes"] == 0
    assert d.terminate() == 0


def test_the_recorded_fixture_is_what_the_app_writes(tmp_path: Path, timeline: Timeline) -> None:
    """tests/fixtures/pino/lines.ndjson (the pure tests' input) has the shape the app writes today:
    the same messages in the same order, the same keys on each line."""
    app = node_app()
    log = tmp_path / "app.log"
    now = run_app(app, log, timeline)
    recorded = [json.loads(ln) for ln in (FIXTURE / "lines.ndjson").read_bytes().splitlines()]
    assert [ln["msg"] for ln in now] == [ln["msg"] for ln in recorded]
    for a, b in zip(now, recorded, strict=True):
        assert set(a) - {"_offset"} == set(b), (a["msg"], set(a) ^ set(b))
        if "req" in b:
            assert set(a["req"]) == set(b["req"]) and set(a["req"]["headers"]) == set(b["req"]["headers"])
