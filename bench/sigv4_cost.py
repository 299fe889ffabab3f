"""What signing a bulk request with AWS SigV4 costs, per request: botocore's SigV4Auth against
shipper's own signer (shipper/ship/sigv4.py), each with the SHA-256 of the body, for the body
sizes a backlog sends (gzip of 2,000 pino lines) and a caught-up host sends (a few lines).

    python bench/sigv4_cost.py [--repeat 5] [--number 2000]

Best of `--repeat` rounds of `--number` calls; the machine is shared, so compare within one run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import timeit
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import ReadOnlyCredentials  # noqa: E402

from shipper.ship.sigv4 import Frozen, encode_query, sign  # noqa: E402

HOST = "search-logs-abc123xyz.eu-west-1.es.amazonaws.com"
TARGET = "/_bulk?" + encode_query("filter_path=errors,items.*.status,items.*.failure_store,items.*.error.type")
HEADERS = {"Content-Type": "application/x-ndjson", "Accept": "application/json", "User-Agent": "shipper/0.1",
           "Content-Encoding": "gzip"}
KEY, SECRET, TOKEN = "ASIABENCHBENCHBENCH1", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "FwoG" + "x" * 400


def botocore_sign(body: bytes) -> str:
    payload_hash = hashlib.sha256(body).hexdigest()
    request = AWSRequest(method="POST", url=f"https://{HOST}{TARGET}", data=body,
                         headers={**HEADERS, "X-Amz-Content-SHA256": payload_hash})
    SigV4Auth(ReadOnlyCredentials(KEY, SECRET, TOKEN), "es", "eu-west-1").add_auth(request)
    return str(request.headers["Authorization"])


def our_sign(body: bytes) -> str:
    payload_hash = hashlib.sha256(body).hexdigest()
    return sign(Frozen(KEY, SECRET, TOKEN), "eu-west-1", "es", "POST", HOST, TARGET, HEADERS, payload_hash,
                time.time())["Authorization"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args()
    print(f"# load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print("| body | sha256 alone | botocore SigV4Auth + sha256 | shipper's sign + sha256 | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for label, size in (("1 KB (a few lines, caught up)", 1024), ("60 KB (gzip of 2,000 lines)", 60_000),
                        ("300 KB", 300_000)):
        body = os.urandom(size)

        def best(fn: Callable[[bytes], object]) -> float:
            rounds: list[float] = timeit.repeat(lambda: fn(body), number=args.number, repeat=args.repeat)
            return min(rounds) / int(args.number)

        sha = best(lambda b: hashlib.sha256(b).hexdigest())
        boto, ours = best(botocore_sign), best(our_sign)
        print(f"| {label} | {sha * 1e6:.0f} us | {boto * 1e6:.0f} us | {ours * 1e6:.0f} us | {boto / ours:.1f}x |")


if __name__ == "__main__":
    main()
