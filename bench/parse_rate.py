"""Parse throughput per format: lines/s of RegexParser (nginx, apache, syslog 3164 and 5424), of
MultilineAggregator on Java stack traces, and of container logs (format docker and cri: pino
lines wrapped as dockerd / containerd write them, 2% of them 40 KiB lines in 16 KiB pieces,
stdout and stderr interleaved), over ~100k generated lines each.

For docker and cri two figures: the joiner alone (physical lines -> joined records) and the
whole pure path to bulk bytes (joiner + DocBuilder.build_container); next to them, the same pino
lines as a plain file (format auto through DocBuilder.build, the C path when built) and that file
with format auto's per-read look for container records (two lines a read, as the reader does).

Lines are generated from a fixed seed, so every run parses the same input:
    .venv/bin/python bench/parse_rate.py [--lines N]
"""

from __future__ import annotations

import argparse
import calendar
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from shipper.config import InputConfig
from shipper.model import Line
from shipper.parse.container import ContainerEvent, is_container_record, physical_max_line_bytes
from shipper.parse.container_join import ContainerJoiner
from shipper.parse.document import DocBuilder
from shipper.parse.multiline import MultilineAggregator
from shipper.parse.regex import RegexParser
from shipper.tail.lines import LineSplitter

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from gen import PinoGenerator  # noqa: E402  (bench/gen.py: the benchmarks' pino lines)

from tests.support.container_writer import cri_pieces, docker_pieces, ticks  # noqa: E402

NOW = float(calendar.timegm((2026, 11, 30, 12, 0, 0)))
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
PATHS = ("/", "/api/v1/items?page=2", "/static/app.3f9a1c.js", "/login", "/cart/checkout",
         "/img/logo.png", "/api/v1/orders/991", "/healthz")
AGENTS = ("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
          "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
          "curl/8.5.0", "kube-probe/1.29", "-")


class LogClock:
    """Event times as a busy server writes them: increasing, ~200 lines a second."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.t = NOW - 86400

    def next(self) -> time.struct_time:
        self.t += self.rng.expovariate(200.0)
        return time.gmtime(self.t)


def clf_time(clock: LogClock) -> str:
    t = clock.next()
    return f"{t.tm_mday:02d}/{MONTHS[t.tm_mon - 1]}/{t.tm_year}:{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000"


def gen_combined(rng: random.Random, n: int) -> list[str]:
    out = []
    clock = LogClock(rng)
    for _ in range(n):
        ip = (f"203.0.113.{rng.randrange(256)}" if rng.random() < 0.8
              else f"2001:db8::{rng.randrange(65536):x}")
        user = "alice" if rng.random() < 0.1 else "-"
        size = str(rng.randrange(50, 90000)) if rng.random() < 0.9 else "-"
        out.append(f'{ip} - {user} [{clf_time(clock)}] "{rng.choice(("GET", "POST"))} {rng.choice(PATHS)} '
                   f'HTTP/1.1" {rng.choice((200, 200, 200, 304, 404, 500))} {size} '
                   f'"https://shop.example.com/" "{rng.choice(AGENTS)}"')
    return out


def gen_3164(rng: random.Random, n: int) -> list[str]:
    out = []
    clock = LogClock(rng)
    for _ in range(n):
        t = clock.next()
        stamp = f"{MONTHS[t.tm_mon - 1]} {t.tm_mday:2d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
        app = rng.choice(("sshd", "CRON", "systemd", "postfix/smtpd"))
        out.append(f"<{rng.randrange(192)}>{stamp} web-{rng.randrange(10):02d} {app}[{rng.randrange(1, 65536)}]: "
                   f"Accepted publickey for deploy from 198.51.100.{rng.randrange(256)} port {rng.randrange(65536)} ssh2")
    return out


def gen_5424(rng: random.Random, n: int) -> list[str]:
    out = []
    clock = LogClock(rng)
    for _ in range(n):
        t = clock.next()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{rng.randrange(1000):03d}Z"
        sd = (f'[exampleSDID@32473 iut="{rng.randrange(9)}" eventSource="Application" eventID="{rng.randrange(9999)}"]'
              if rng.random() < 0.5 else "-")
        out.append(f"<{rng.randrange(192)}>1 {stamp} app-{rng.randrange(10):02d}.example.com billing "
                   f"{rng.randrange(1, 65536)} ID{rng.randrange(100)} {sd} payment accepted for order {rng.randrange(10**6)}")
    return out


def gen_java(rng: random.Random, n: int) -> list[Line]:
    lines: list[Line] = []
    pos = 0
    clock = LogClock(rng)
    while len(lines) < n:
        t = clock.next()
        head = time.strftime("%Y-%m-%d %H:%M:%S", t) + f".{rng.randrange(1000):03d} ERROR [main] c.e.OrderService - order failed"
        block = [head]
        if rng.random() < 0.3:
            block += ["com.example.PaymentException: card declined"]
            block += [f"\tat com.example.Layer{i}.call(Layer{i}.java:{rng.randrange(500)})" for i in range(rng.randrange(5, 20))]
            block += ["Caused by: java.net.SocketTimeoutException: Read timed out", f"\t... {rng.randrange(5, 30)} more"]
        for text in block:
            data = text.encode()
            lines.append((pos, pos + len(data) + 1, data, 0))
            pos += len(data) + 1
    return lines


def gen_pino(n: int) -> list[bytes]:
    return [ln.encode() for ln in PinoGenerator(7, 350).batch(n)]


def gen_container(fmt: str, pino: list[bytes], rng: random.Random) -> bytes:
    """The pino lines as a runtime writes them; 2% become 40 KiB lines (3 pieces), 10% go to stderr."""
    clock = ticks(int(NOW * 1e9))
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    order: list[str] = []
    for line in pino:
        stream = "stderr" if rng.random() < 0.1 else "stdout"
        if rng.random() < 0.02:
            line = line[:-1] + b',"blob":"' + b"b" * 40_000 + b'"}'
        recs = docker_pieces(line, stream, next(clock)) if fmt == "docker" else cri_pieces(line, stream, next(clock))
        out[stream] += recs
        order += [stream] * len(recs)
    pos = {"stdout": 0, "stderr": 0}
    blob = []
    for stream in order:                 # pieces of the two streams interleave as they were written
        blob.append(out[stream][pos[stream]])
        pos[stream] += 1
    return b"".join(blob)


def container_rows(n: int) -> list[tuple[str, int, float, int, str]]:
    rows: list[tuple[str, int, float, int, str]] = []
    pino = gen_pino(n)
    path = "/var/log/containers/checkout-7d9f8b6c5-x2x9q_shop_api-" + "9a" * 32 + ".log"
    plain = [(i * 400, i * 400 + len(d) + 1, d, 0) for i, d in enumerate(pino)]
    auto = DocBuilder(InputConfig(paths=("/x/*.log",), format="auto"), "logs-%Y.%m.%d", "node-1")

    def run_plain() -> int:
        out: list[bytes] = []
        auto.build("inc", path, plain, NOW, out)
        return len(out)

    rate, docs = rate_of(run_plain, len(plain))
    rows.append(("pino file (auto)", len(plain), rate, docs, "docs"))

    def run_auto_check() -> int:
        # what the reader does per read of a plain file (sources/file_reading.py `_sniff`): two lines looked at
        out: list[bytes] = []
        for i in range(0, len(plain), 1000):
            batch = plain[i:i + 1000]
            if is_container_record(batch[0][2]) or is_container_record(batch[-1][2]):
                raise AssertionError("a pino line taken for a container record")
            auto.build("inc", path, batch, NOW, out)
        return len(out)

    rate, docs = rate_of(run_auto_check, len(plain))
    rows.append(("pino file (auto+sniff)", len(plain), rate, docs, "docs"))
    for fmt in ("docker", "cri"):
        blob = gen_container(fmt, pino, random.Random(11))
        lines = LineSplitter(0, physical_max_line_bytes(fmt, 1024 * 1024)).feed(blob)
        builder = DocBuilder(InputConfig(paths=("/var/log/containers/*.log",), format=fmt), "logs-%Y.%m.%d", "node-1")

        def run_join(fmt: str = fmt, lines: list[Line] = lines) -> int:
            j = ContainerJoiner(fmt, 1024 * 1024)  # type: ignore[arg-type]
            evs: list[ContainerEvent] | None = j.feed_lines(lines, NOW)
            return len(evs or [])

        rate, events = rate_of(run_join, len(lines))
        rows.append((f"{fmt} join", len(lines), rate, events, "records"))

        def run_docs(fmt: str = fmt, lines: list[Line] = lines, builder: DocBuilder = builder) -> int:
            j = ContainerJoiner(fmt, 1024 * 1024)  # type: ignore[arg-type]
            out: list[bytes] = []
            for i in range(0, len(lines), 1000):
                evs = j.feed_lines(lines[i:i + 1000], NOW) or []
                builder.build_container("inc", path, evs, NOW, out)
            return len(out)

        rate, docs = rate_of(run_docs, len(lines))
        rows.append((f"{fmt} docs", len(lines), rate, docs, "docs"))
    return rows


def rate_of(run: Callable[[], int], n: int) -> tuple[float, int]:
    best = float("inf")
    got = 0
    for _ in range(3):
        t0 = time.perf_counter()
        got = run()
        best = min(best, time.perf_counter() - t0)
    return n / best, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    n = ap.parse_args().lines
    rows: list[tuple[str, int, float, int, str]] = []
    for name, pattern, lines in (
        ("nginx", "nginx", gen_combined(random.Random(1), n)),
        ("apache", "apache", gen_combined(random.Random(2), n)),
        ("syslog 3164", "syslog", gen_3164(random.Random(3), n)),
        ("syslog 5424", "syslog", gen_5424(random.Random(4), n)),
    ):
        parser = RegexParser(pattern, "UTC")

        def run(parser: RegexParser = parser, lines: list[str] = lines) -> int:
            parse = parser.parse
            return sum(1 for text in lines if parse(text, NOW) is not None)

        rate, matched = rate_of(run, len(lines))
        rows.append((name, len(lines), rate, matched, "parsed"))

    java = gen_java(random.Random(5), n)

    def run_java() -> int:
        agg = MultilineAggregator(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
        feed = agg.feed
        events = 0
        for line in java:
            events += len(feed(line, NOW))
        return events + len(agg.flush())

    rate, events = rate_of(run_java, len(java))
    rows.append(("multiline java", len(java), rate, events, "events"))
    rows += container_rows(n)

    print(f"{'format':<24}{'lines':>9}{'lines/s':>12}  result")
    for name, count, rate, got, what in rows:
        print(f"{name:<24}{count:>9}{rate:>12,.0f}  {got} {what}")


if __name__ == "__main__":
    main()
