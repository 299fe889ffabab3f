"""Deterministic generator of realistic pino (Node.js) JSON log lines for the benchmarks.

Owns the shape of the benchmark input: the same (n, line_bytes, seed) always gives the same
bytes. Used by run.py (a cached input file) and latency.py (lines appended at a steady rate).

    python bench/gen.py N OUT [--line-bytes B] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

DEFAULT_LINE_BYTES = 350
DEFAULT_SEED = 1
START_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_CHUNK_LINES = 50_000

_HOSTS = [f"api-{i:02d}.prod.internal" for i in range(8)] + ["worker-a7f3", "worker-b21c"]
_PIDS = [1187, 2203, 4411, 5120, 7731, 9004]
_METHODS = ["GET"] * 7 + ["POST"] * 2 + ["PUT", "DELETE", "PATCH"]
_PATHS = [
    "/api/v1/users/{id}", "/api/v1/users/{id}/orders", "/api/v1/orders/{id}", "/health",
    "/api/v1/search?q=shoes&page={n}", "/api/v2/carts/{id}/items", "/login", "/logout",
    "/api/v1/products/{id}/reviews?sort=recent", "/static/app.{id}.js", "/metrics",
    "/api/v1/payments/{id}/capture", "/graphql", "/api/v1/inventory?warehouse={n}",
]
_AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Version/17.5 Safari/605.1.15",
    "curl/8.5.0", "okhttp/4.12.0", "Go-http-client/1.1", "kube-probe/1.30",
]
_MSG_INFO = [
    "request completed", "incoming request", "user authenticated", "cache hit for key {id}",
    "order {id} created", "payment authorised for order {id}", "connected to database pool",
    "job {id} finished in {n} ms", "session refreshed", "feature flag evaluated: checkout_v2=on",
    "sent email notification to user {id}", "rate limit bucket refilled",
]
_MSG_WARN = [
    "slow query took {n} ms", "retrying upstream call (attempt {n})", "cache miss for key {id}",
    "deprecated API version used by client", "request body larger than {n} KiB",
]
_MSG_ERROR = [
    "upstream responded 503 Service Unavailable", "failed to charge card: insufficient_funds",
    "ECONNRESET while talking to redis at 10.0.3.{n}:6379", r'validation failed: \"email\" is required',
    "unhandled rejection in job {id}: TimeoutError: operation timed out after {n} ms",
]
_STATUS_FOR_LEVEL = {30: [200] * 12 + [201, 204, 301, 304], 40: [404, 409, 422, 429, 200], 50: [500, 502, 503, 504]}
_LEVELS = [30, 40, 50]
_LEVEL_WEIGHTS = [88, 8, 4]
_WORDS = (
    "alpha beta gamma delta tenant region shard replica cursor batch tier cohort "
    "request upstream cache session token worker queue partition checkout catalog"
).split()


class PinoGenerator:
    """Stateful, seeded source of pino lines (str, no trailing newline).

    `seq` counts from 0 across calls; `time` increases by 0-3 ms a line unless `time_ms` is given.
    Each line is padded with a `ctx` field so the mean line length is close to `line_bytes`.
    """

    def __init__(self, seed: int = DEFAULT_SEED, line_bytes: int = DEFAULT_LINE_BYTES) -> None:
        self._rng = random.Random(seed)
        self._line_bytes = line_bytes
        self.seq = 0
        self._time_ms = START_TIME_MS
        self._debt = 0.0
        filler = " ".join(self._rng.choice(_WORDS) for _ in range(400))
        self._filler = filler

    def batch(self, count: int, time_ms: int | None = None) -> list[str]:
        rng = self._rng
        levels = rng.choices(_LEVELS, _LEVEL_WEIGHTS, k=count)
        steps = rng.choices((0, 1, 1, 2, 3), k=count)
        hosts = rng.choices(_HOSTS, k=count)
        pids = rng.choices(_PIDS, k=count)
        methods = rng.choices(_METHODS, k=count)
        paths = rng.choices(_PATHS, k=count)
        # kinds: 0 bare message, 1 req summary, 2 req with headers (the long lines)
        kinds = rng.choices((0, 1, 2), (30, 45, 25), k=count)
        # spread of line lengths around the target: 0.6x .. 1.4x
        spreads = rng.choices((0.6, 0.75, 0.9, 1.0, 1.0, 1.1, 1.25, 1.4), k=count)
        numbers = rng.choices(range(1, 5000), k=count)
        agents = rng.choices(_AGENTS, k=count)
        picks = rng.choices(range(60), k=count)
        getrandbits = rng.getrandbits
        filler = self._filler
        target = self._line_bytes
        out: list[str] = []
        append = out.append
        seq = self.seq
        t = self._time_ms
        debt = self._debt
        for i in range(count):
            level = levels[i]
            if time_ms is None:
                t += steps[i]
                ts = t
            else:
                ts = time_ms
            rid = f"{getrandbits(128):032x}"
            req_id = f"{rid[:8]}-{rid[8:12]}-{rid[12:16]}-{rid[16:20]}-{rid[20:]}"
            n = numbers[i]
            ident = rid[:6]
            pool = _MSG_INFO if level == 30 else _MSG_WARN if level == 40 else _MSG_ERROR
            msg = pool[picks[i] % len(pool)].replace("{id}", ident).replace("{n}", str(n))
            head = (
                f'{{"level":{level},"time":{ts},"pid":{pids[i]},"hostname":"{hosts[i]}",'
                f'"reqId":"{req_id}","seq":{seq}'
            )
            kind = kinds[i]
            if kind == 0:
                body = f',"msg":"{msg}"'
            else:
                url = paths[i].replace("{id}", ident).replace("{n}", str(n % 97))
                statuses = _STATUS_FOR_LEVEL[level]
                status = statuses[picks[i] % len(statuses)]
                rt = round(n / 37.0, 3)
                if kind == 1:
                    req = f'{{"method":"{methods[i]}","url":"{url}"}}'
                else:
                    req = (
                        f'{{"method":"{methods[i]}","url":"{url}","headers":{{"host":"shop.example.com",'
                        f'"user-agent":"{agents[i]}","accept":"application/json"}},'
                        f'"remoteAddress":"10.{n % 256}.{(n >> 3) % 256}.{n % 251}","remotePort":{40000 + n}}}'
                    )
                body = (
                    f',"req":{req},"res":{{"statusCode":{status}}},"responseTime":{rt},"msg":"{msg}"'
                )
            line = head + body
            # `debt` (bytes over target so far) pulls later lines shorter, so the mean converges
            # on line_bytes even though the lines with headers alone are longer than that.
            pad = int(target * spreads[i] - debt * 0.25) - len(line) - 10  # 10 = len(',"ctx":""}')
            if pad > 0:
                start = (n * 7) % (len(filler) - pad) if pad < len(filler) else 0
                line = f'{line},"ctx":"{filler[start:start + pad]}"}}'
            else:
                line += "}"
            debt += len(line) + 1 - target
            append(line)
            seq += 1
        self.seq = seq
        self._time_ms = t
        self._debt = debt
        return out


def generate(path: str, n: int, line_bytes: int = DEFAULT_LINE_BYTES, seed: int = DEFAULT_SEED) -> int:
    """Write `n` lines to `path` (atomically: a temp file renamed into place). Returns bytes written."""
    gen = PinoGenerator(seed, line_bytes)
    tmp = f"{path}.tmp{os.getpid()}"
    total = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        left = n
        while left > 0:
            k = min(left, _CHUNK_LINES)
            text = "\n".join(gen.batch(k)) + "\n"
            f.write(text)
            total += len(text)
            left -= k
    os.replace(tmp, path)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write N deterministic pino lines to OUT")
    ap.add_argument("n", type=int, help="number of lines")
    ap.add_argument("out", help="output file")
    ap.add_argument("--line-bytes", type=int, default=DEFAULT_LINE_BYTES, help="mean line length (default 350)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    size = generate(args.out, args.n, args.line_bytes, args.seed)
    dt = time.perf_counter() - t0
    print(
        f"wrote {args.n} lines, {size} bytes (mean {size / max(args.n, 1):.1f} B/line incl. newline) "
        f"to {args.out} in {dt:.2f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
