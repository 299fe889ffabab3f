"""`shipper demo`: the whole pipeline on this machine, against an embedded OpenSearch-compatible server.

Writes sample pino logs into a temp dir, rotates them once (rename, like logrotate's `create`),
runs the real daemon on them, and prints what was written, what arrived, duplicates and a hit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from typing import Any

from shipper.clock import SystemClock

MSGS = ("request completed", "user logged in", "cache miss", "payment accepted", "slow query",
        "connection reset by peer", "job finished", "retrying upstream call")


def _pino(seq: int, rng: random.Random, now: float) -> str:
    """A line as pino-http under OpenTelemetry's pino instrumentation writes one (trace_id,
    span_id): shipper adds the ECS fields Kibana reads (docs/pino.md), which the hit shows."""
    level = rng.choice((30, 30, 30, 30, 40, 50))
    msg = rng.choice(MSGS)
    doc: dict[str, Any] = {"level": level, "time": int(now * 1000), "pid": 4242,
                           "hostname": socket.gethostname(), "name": "demo-shop",
                           "trace_id": f"{rng.getrandbits(128):032x}", "span_id": f"{rng.getrandbits(64):016x}",
                           "msg": msg, "seq": seq}
    if msg.startswith("payment") or rng.random() < 0.5:
        doc["req"] = {"id": seq + 1, "method": rng.choice(("GET", "POST")),
                      "url": f"/api/items/{rng.randrange(1000)}?page={rng.randrange(1, 5)}",
                      "headers": {"user-agent": "Mozilla/5.0 (X11; Linux x86_64) demo/1.0"},
                      "remoteAddress": "127.0.0.1", "remotePort": 40000 + rng.randrange(20000)}
        doc["res"] = {"statusCode": rng.choice((200, 200, 201, 404, 500))}
        doc["responseTime"] = rng.randrange(1, 120)
    return json.dumps(doc, separators=(",", ":"))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str) -> Any:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _all_seqs(es: str) -> list[int]:
    seqs: list[int] = []
    after: list[Any] | None = None
    while True:
        body: dict[str, Any] = {"size": 1000, "sort": [{"log.offset": "asc"}, {"_id": "asc"}], "_source": ["seq"]}
        if after is not None:
            body["search_after"] = after
        req = urllib.request.Request(es + "/demo-*/_search", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            hits = json.loads(r.read())["hits"]["hits"]
        if not hits:
            return seqs
        seqs.extend(h["_source"].get("seq", -1) for h in hits)
        after = hits[-1]["sort"]


def demo(lines: int = 3000) -> int:
    try:
        from osmem_server import OsmemServer
    except ImportError:
        print("shipper demo needs the embedded server: pip install 'shipper[demo]'", file=sys.stderr)
        return 1
    rng = random.Random(7)
    clock = SystemClock()
    work = tempfile.mkdtemp(prefix="shipper-demo-")
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    print(f"shipper demo: working in {work}")
    server = OsmemServer.start(japanese=False)
    proc = None
    try:
        es = server.url
        print(f"embedded OpenSearch-compatible server: {es} ({server.version})")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = os.path.join(work, "shipper.yaml")
        with open(cfg, "w") as f:
            f.write(f"""state_dir: {work}/state
log_level: info
inputs:
  - paths: ['{logs}/*.log']
    fields: {{service: {{environment: demo}}}}     # merged with service.name, from pino's name
output:
  elasticsearch:
    hosts: ['{es}']
    index: 'demo-%Y.%m.%d'
    flush_interval: 200ms
metrics:
  listen: 127.0.0.1:{port}
""")
        app = os.path.join(logs, "app.log")
        half = lines // 2
        with open(app, "w") as f:
            for i in range(half):
                f.write(_pino(i, rng, clock.time()) + "\n")
        print(f"wrote {half} pino lines to {app}; starting `shipper run -c {cfg}`")
        err = open(os.path.join(work, "shipper.log"), "w")
        proc = subprocess.Popen([sys.executable, "-m", "shipper", "run", "-c", cfg], stderr=err)
        # rotate like logrotate's `create` mode while the daemon runs, then keep writing
        ready_by = clock.monotonic() + 30
        while clock.monotonic() < ready_by and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                clock.pause(0.1)
        if proc.poll() is not None:
            print(f"shipper exited early with code {proc.returncode}; see {err.name}", file=sys.stderr)
            return 1
        ready_at = clock.monotonic()     # the first half waits from here, the rest from their writes
        os.rename(app, app + ".1")
        with open(app, "w") as f:
            for i in range(half, lines):
                f.write(_pino(i, rng, clock.time()) + "\n")
        print(f"rotated {app} -> app.log.1 and wrote {lines - half} more lines to a new app.log")
        count = 0
        t0 = clock.monotonic()
        last_progress = t0
        while clock.monotonic() - last_progress < 20:      # give up after 20 s without progress
            try:
                _post(es + "/_refresh")
                now_count = _get(es + "/demo-*/_count")["count"]
            except Exception:
                now_count = count
            if now_count > count:
                count, last_progress = now_count, clock.monotonic()
            if count >= lines or proc.poll() is not None:
                break
            clock.pause(0.25)
        arrived_at = clock.monotonic()
        took = arrived_at - t0
        seqs = _all_seqs(es)
        distinct = set(seqs)
        missing = set(range(lines)) - distinct
        dups = len(seqs) - len(distinct)
        print()
        print(f"  lines written:     {lines}")
        print(f"  documents arrived: {len(seqs)}  (in {took:.1f}s)")
        print(f"  missing lines:     {len(missing)}")
        print(f"  duplicates:        {dups}")
        # an upper bound for every line: each was written after ready_at or waited from it
        print(f"  slowest line:      at most {arrived_at - ready_at:.1f}s after it was written (or shipper was ready), the server's indexing included")
        hit = None
        req = urllib.request.Request(es + "/demo-*/_search", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"size": 1, "query": {"match": {"message": "payment"}}}).encode())
        with urllib.request.urlopen(req, timeout=10) as r:
            hits = json.loads(r.read())["hits"]["hits"]
            hit = hits[0] if hits else None
        if hit:
            src = hit["_source"]
            print("\nsample search hit (message:payment), the ECS fields Kibana reads first (inputs[].ecs):")
            ecs = ("@timestamp", "message", "log", "host", "service", "trace", "span", "process", "http", "url",
                   "client", "user_agent", "event")
            shown = {k: src[k] for k in ecs if k in src} | {k: v for k, v in src.items() if k not in ecs}
            print(json.dumps({"_index": hit["_index"], "_id": hit["_id"], "_source": shown}, indent=2))
        ok = not missing and dups == 0 and len(seqs) == lines
        print("\nall lines arrived exactly once" if ok else "\nSOMETHING WENT WRONG: see " + err.name)
        return 0 if ok else 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.close()
        if os.environ.get("SHIPPER_DEMO_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)
