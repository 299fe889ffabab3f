"""SigV4: our signature equals botocore's for any request (hypothesis), and the tests' independent
verifier accepts it; the `aws_sigv4` config section."""

from __future__ import annotations

import calendar
import hashlib
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import load_config_text
from shipper.errors import ConfigError
from shipper.ship.sigv4 import Frozen, encode_query, sign
from tests.support.sigv4 import Credential, verify

_SEGMENT = st.text(st.sampled_from("abcXYZ019-_.~*,:%@!$&'()+= é/"), min_size=0, max_size=8)
_QUERY_PART = st.text(st.sampled_from("abc019-_.~*,:%@!$'()+ é"), max_size=10)
_HEADER_NAME = st.sampled_from(["Content-Type", "Accept", "Content-Encoding", "User-Agent", "X-Opaque-Id",
                                "x-custom-a", "Connection", "Expect", "traceparent"])
_HEADER_VALUE = st.text(st.sampled_from("ab /;=,-\t"), min_size=1, max_size=12).filter(lambda v: v.strip() != "")


@settings(max_examples=300, deadline=None)
@given(method=st.sampled_from(["GET", "POST", "PUT", "HEAD", "DELETE"]),
       segments=st.lists(_SEGMENT, max_size=4), trailing=st.booleans(),
       query=st.lists(st.tuples(_QUERY_PART, _QUERY_PART), max_size=4),
       headers=st.dictionaries(_HEADER_NAME, _HEADER_VALUE, max_size=5),
       body=st.binary(max_size=300), token=st.one_of(st.none(), st.text("abcXYZ/+=", min_size=1, max_size=40)),
       service=st.sampled_from(["es", "aoss"]), port=st.sampled_from([443, 9200]))
def test_our_signature_is_botocores_and_the_verifier_accepts_it(
        method: str, segments: list[str], trailing: bool, query: list[tuple[str, str]], headers: dict[str, str],
        body: bytes, token: str | None, service: str, port: int) -> None:
    from urllib.parse import quote
    path = "/" + "/".join(quote(s, safe="") for s in segments) + ("/" if trailing and segments else "")
    raw_query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
    target = path + ("?" + encode_query(raw_query) if raw_query else "")
    host = "search-logs.eu-west-1.es.amazonaws.com" + ("" if port == 443 else f":{port}")
    creds = Frozen("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    payload_hash = hashlib.sha256(body).hexdigest()
    request = AWSRequest(method=method, url=f"https://{host}{target}", data=body,
                         headers={**headers, "X-Amz-Content-SHA256": payload_hash})
    SigV4Auth(ReadOnlyCredentials(creds.access_key, creds.secret_key, token), service, "eu-west-1").add_auth(request)
    signed_at = float(calendar.timegm(time.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")))
    ours = sign(creds, "eu-west-1", service, method, host, target, headers, payload_hash, signed_at + 0.5)
    assert ours["Authorization"] == request.headers["Authorization"]
    assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
    assert ours.get("X-Amz-Security-Token") == request.headers.get("X-Amz-Security-Token")

    sent = [("Host", host), *headers.items(), *((k, v) for k, v in ours.items())]
    lookup = {"AKIDEXAMPLE": Credential(creds.secret_key, token)}.get
    assert verify(method, target, sent, body, lookup, "eu-west-1", service, now=signed_at) is None


def test_encode_query_leaves_only_unreserved_characters() -> None:
    assert encode_query("filter_path=errors,items.*.status&pipeline=my pipe") == \
        "filter_path=errors%2Citems.%2A.status&pipeline=my%20pipe"
    assert encode_query(encode_query("a=b,c*")) == encode_query("a=b,c*")        # idempotent


def test_aws_sigv4_config() -> None:
    base = "output:\n  elasticsearch:\n    hosts: ['https://search-x.eu-west-1.es.amazonaws.com']\n"
    c = load_config_text(base + "    aws_sigv4: {region: eu-west-1, service: aoss}\n", env={})
    assert c.output.aws_sigv4 is not None and (c.output.aws_sigv4.region, c.output.aws_sigv4.service) == ("eu-west-1", "aoss")
    c = load_config_text(base + "    aws_sigv4: {}\n", env={"AWS_REGION": "us-east-2"})
    assert c.output.aws_sigv4 is not None and (c.output.aws_sigv4.region, c.output.aws_sigv4.service) == ("us-east-2", "es")
    for extra, key, words in (
            ("    aws_sigv4: {}\n", "output.elasticsearch.aws_sigv4.region", "is required"),
            ("    aws_sigv4: {region: Europe}\n", "output.elasticsearch.aws_sigv4.region", "not an AWS region"),
            ("    aws_sigv4: {region: eu-west-1, service: s3}\n", "output.elasticsearch.aws_sigv4.service", "es, aoss"),
            ("    aws_sigv4: {region: eu-west-1, profile: x}\n", "output.elasticsearch.aws_sigv4.profile", ""),
            ("    aws_sigv4: {region: eu-west-1}\n    api_key: k\n", "output.elasticsearch.aws_sigv4", "api_key"),
            ("    aws_sigv4: {region: eu-west-1}\n    username: u\n", "output.elasticsearch.aws_sigv4", "username")):
        with pytest.raises(ConfigError) as e:
            load_config_text(base + extra, env={})
        assert e.value.key == key and words in e.value.message, e.value
