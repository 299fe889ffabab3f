"""The tests' SigV4 verifier against AWS's published test suite (tests/fixtures/sigv4_test_suite.json)."""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path

import pytest

from tests.support.sigv4 import Credential, verify

SUITE = json.loads((Path(__file__).parent.parent / "fixtures" / "sigv4_test_suite.json").read_text())


def _parse(sreq: str) -> tuple[str, str, list[tuple[str, str]], bytes]:
    head, _, body = sreq.partition("\n\n")
    lines = head.split("\n")
    method, target, _version = lines[0].split(" ")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))      # as an HTTP server reads a header
    return method, target, headers, body.encode()


@pytest.mark.parametrize("case", sorted(SUITE["cases"]))
def test_the_verifier_accepts_each_case_of_the_suite_and_refuses_any_change(case: str) -> None:
    method, target, headers, body = _parse(SUITE["cases"][case])
    by_name = {k.lower(): v for k, v in headers}
    signed_at = calendar.timegm(time.strptime(by_name["x-amz-date"], "%Y%m%dT%H%M%SZ"))
    token = by_name.get("x-amz-security-token")
    creds = {SUITE["access_key"]: Credential(SUITE["secret_key"], token)}

    def check(m: str = method, t: str = target, h: list[tuple[str, str]] = headers, b: bytes = body) -> str | None:
        return verify(m, t, h, b, creds.get, SUITE["region"], SUITE["service"], now=signed_at + 60,
                      require_content_sha256=False)

    assert check() is None
    assert check(m="PUT") is not None
    assert check(b=body + b"x") is not None
    assert check(t=target + ("&" if "?" in target else "?") + "extra=1") is not None
    assert check(h=[(k, v + "x") if k.lower() == "x-amz-date" else (k, v) for k, v in headers]) is not None
    wrong = dict(creds)
    wrong[SUITE["access_key"]] = Credential(SUITE["secret_key"][:-1] + "Z", token)
    assert verify(method, target, headers, body, wrong.get, SUITE["region"], SUITE["service"],
                  now=signed_at + 60, require_content_sha256=False) is not None
    assert verify(method, target, headers, body, creds.get, "eu-west-1", SUITE["service"], now=signed_at + 60,
                  require_content_sha256=False) is not None
    expired = {SUITE["access_key"]: Credential(SUITE["secret_key"], token, expires_at=signed_at + 30)}
    assert "expired" in str(verify(method, target, headers, body, expired.get, SUITE["region"], SUITE["service"],
                                   now=signed_at + 60, require_content_sha256=False))
