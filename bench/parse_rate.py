"""Parse throughput per format: lines/s of RegexParser (nginx, apache, syslog 3164 and 5424) and
of MultilineAggregator on Java stack traces, over ~100k generated lines each.

Lines are generated from a fixed seed, so every run parses the same input:
    .venv/bin/python bench/parse_rate.py [--lines N]
"""

from __future__ import annotations

import argparse
import calendar
import random
import time
from collections.abc import Callable

from shipper.model import Line
from shipper.parse.multiline import MultilineAggregator
from shipper.parse.regex import RegexParser

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

    print(f"{'format':<16}{'lines':>9}{'lines/s':>12}  result")
    for name, count, rate, got, what in rows:
        print(f"{name:<16}{count:>9}{rate:>12,.0f}  {got} {what}")


if __name__ == "__main__":
    main()
