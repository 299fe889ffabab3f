"""Destinations of every kind, through the real daemon: Elastic's failure store, `document_id:
none` (OpenSearch Serverless time series), a forward proxy, AWS SigV4. Each test ends with the
oracle: every written line exactly once, within a bound of when it was written, nothing secret in
the output.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.aws import CredentialAuthority, FakeEcs, FakeImds, FakeSts
from tests.support.daemon import write_config
from tests.support.es import ES, ESError
from tests.support.forward_proxy import Tinyproxy
from tests.support.pki import make_ca, server_context
from tests.support.proxy import FAILURE_STORE, BulkItem, FaultProxy, ItemVerdict
from tests.support.wait import wait_until
from tests.support.writer import Writer, write_lines

pytestmark = pytest.mark.slow

ARRIVAL_BOUND_S = 30.0      # each line written is in the destination within this (a loaded 2-core machine)


def _logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    return logs


def _records(output: str) -> list[dict[str, Any]]:
    out = []
    for line in output.splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _count(es: ES, index: str) -> int:
    try:
        return es.count(index)
    except ESError as e:
        if e.status == 404:          # not created yet
            return 0
        raise


def _arrive(es: ES, index: str, n: int, written_at: float, tail: Any) -> None:
    """All `n` documents are in `index` within ARRIVAL_BOUND_S of when they were written."""
    wait_until(lambda: _count(es, index) >= n,
               lambda: f"{n} documents in {index} (have {_count(es, index)})\n{tail()}",
               timeout_s=max(1.0, written_at + ARRIVAL_BOUND_S - time.monotonic()))


def test_failure_store_items_count_as_delivered_with_their_metric_and_one_log_line(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    stored_seqs: set[int] = set()

    def every_seventh(item: BulkItem) -> ItemVerdict:
        seq = orjson.loads(item.source or b"{}").get("seq")
        if isinstance(seq, int) and seq % 7 == 3:
            stored_seqs.add(seq)
            return FAILURE_STORE
        return None

    fault_proxy.item_failures(every_seventh)
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                       extra_yaml={"output": {"elasticsearch": {"data_stream": {"dataset": "app"},
                                                                 "index_template": "off"}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(300))
    _arrive(es, "logs-app-*,.fs-logs-app-*", 300, t0, d.tail)
    expected_stored = len([s for s in range(300) if s % 7 == 3])
    wait_until(lambda: d.metric("shipper_bulk_items_total", status="failure_store") >= expected_stored,
               lambda: f"the failure_store items counted\n{d.tail()}")
    t1 = time.monotonic()
    write_lines(logs / "app.log", range(300, 400))       # a second round within the minute: no second line
    _arrive(es, "logs-app-*,.fs-logs-app-*", 400, t1, d.tail)
    expected_stored = len([s for s in range(400) if s % 7 == 3])
    wait_until(lambda: d.metric("shipper_bulk_items_total", status="failure_store") == expected_stored,
               lambda: f"{expected_stored} failure_store items counted\n{d.tail()}")
    assert d.metric("shipper_bulk_items_total", status="201") == 400 - expected_stored
    assert d.metric("shipper_events_dead_letter_total") == 0
    lines = [r for r in _records(d.output()) if r.get("msg") == "documents went to the failure store"]
    assert len(lines) == 1, lines                        # at most once a minute, per index
    assert lines[0]["index"] == "logs-app-default" and 1 <= lines[0]["count"] <= expected_stored, lines
    es.assert_exactly_once(range(400), index="logs-app-*,.fs-logs-app-*")
    stored = es.all_docs(".fs-logs-app-default")
    assert {h["_source"]["seq"] for h in stored} == {s for s in range(400) if s % 7 == 3}
    assert d.alive, d.tail()


def test_document_id_none_sends_create_without_id_and_says_at_least_once(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    seen: list[BulkItem] = []
    fault_proxy.item_failures(lambda item: seen.append(item))      # records, fails none
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                       extra_yaml={"output": {"elasticsearch": {"document_id": "none", "index": "ts-metrics"}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(250))
    _arrive(es, "ts-metrics", 250, t0, d.tail)
    assert len(seen) == 250 and all(item.op == "create" and item.id is None for item in seen)
    docs = es.assert_exactly_once(range(250), index="ts-metrics")
    assert len({h["_id"] for h in docs}) == 250                   # the ids Elasticsearch made
    warned = [r for r in _records(d.output()) if str(r.get("msg", "")).startswith("document_id: none: delivery is at least once")]
    assert len(warned) == 1, d.tail()
    check = d.cli("check")
    assert "output: WARNING: document_id: none: delivery is at least once, not exactly once" in check.stdout, check.stdout
    assert d.alive, d.tail()


PROXY_PASSWORD = "Pr0xy-Zebra-Quartz"


def _no_secret(d: Any, secret: str, *outputs: str) -> None:
    """The secret is in none of the daemon's output, status, metrics or the given command outputs."""
    assert secret not in d.output()
    assert secret not in orjson.dumps(d.status_json()).decode()
    assert secret not in "\n".join(f"{k} {v}" for k, v in d.metrics().items())
    for text in outputs:
        assert secret not in text


def test_https_through_a_connect_proxy_with_auth_refusing_then_accepting_then_dropping(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    """HTTPS_PROXY from the environment; a tinyproxy with BasicAuth that first knows another
    password (407 to CONNECT), then ours; TLS end to end: the front (a TLS server whose certificate
    names `localhost` only) sees the SNI `localhost` and the daemon verifies against our CA; the
    proxy stopped while shipping, then back."""
    logs = _logs(tmp_path)
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = make_ca(pki, "test-ca")
    ctx, sni = server_context(pki, ca, "localhost")
    with FaultProxy(osmem_clone.url, ssl_context=ctx) as front, \
            Tinyproxy(tmp_path / "tp", user="shipper", password="not-" + PROXY_PASSWORD) as tp:
        cfg = write_config(tmp_path, es_url=f"https://localhost:{front.port}", paths=[logs / "*.log"],
                           extra_yaml={"output": {"elasticsearch": {"tls": {"ca_file": str(ca[0])}}}})
        env = {"HTTPS_PROXY": tp.url_with("shipper", PROXY_PASSWORD), "NO_PROXY": "example.org"}
        d = daemon_factory(cfg, env=env)
        d.wait_ready()
        write_lines(logs / "app.log", range(200))
        # refused: 407 to CONNECT is a connection error, retried with backoff; nothing reaches the front
        wait_until(lambda: d.metric("shipper_retries_total") >= 3, lambda: f"retries after 407\n{d.tail()}")
        assert front.requests == 0 and _count(es, "logs-*") == 0
        assert "refused CONNECT" in str(d.status_json()), d.status_json()
        check_refused = d.cli("check")
        # (tinyproxy answers a CONNECT with the wrong credentials 401, others 407)
        assert "FAILED" in check_refused.stdout and "refused CONNECT" in check_refused.stdout, check_refused.stdout
        t0 = time.monotonic()
        tp.restart(user="shipper", password=PROXY_PASSWORD)
        _arrive(es, "logs-*", 200, t0, d.tail)
        assert front.requests > 0 and set(sni) == {"localhost"}, sni
        assert "CONNECT localhost:" in tp.output() or "localhost" in tp.output(), tp.output()
        # the proxy goes away while shipping (open tunnels drop with it), then comes back
        tp.stop()
        write_lines(logs / "app.log", range(200, 300))
        retries = d.metric("shipper_retries_total")
        wait_until(lambda: d.metric("shipper_retries_total") > retries, lambda: f"retries, proxy down\n{d.tail()}")
        t1 = time.monotonic()
        tp.start()
        _arrive(es, "logs-*", 300, t1, d.tail)
        es.assert_exactly_once(range(300), index="logs-*")
        check = d.cli("check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"output: https://localhost:{front.port}: reached through proxy {tp.url} (from HTTPS_PROXY)" \
            in check.stdout, check.stdout
        _no_secret(d, PROXY_PASSWORD, check.stdout, check.stderr, check_refused.stdout, check_refused.stderr)
        assert d.alive, d.tail()


def test_http_through_proxy_url_in_absolute_form_and_no_proxy_goes_direct(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    with Tinyproxy(tmp_path / "tp") as tp:
        cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                           extra_yaml={"output": {"elasticsearch": {"proxy_url": tp.url}}})
        d = daemon_factory(cfg)
        d.wait_ready()
        t0 = time.monotonic()
        write_lines(logs / "app.log", range(150))
        _arrive(es, "logs-*", 150, t0, d.tail)
        # tinyproxy took absolute-form requests for the destination and passed them on
        assert f"http://127.0.0.1:{fault_proxy.port}/_bulk" in tp.output(), tp.output()
        started = [r for r in _records(d.output()) if r.get("msg") == "output host reached through a proxy"]
        assert [(r["proxy"], r["from"]) for r in started] == [(tp.url, "output.elasticsearch.proxy_url")], started
        check = d.cli("check")
        assert f"reached through proxy {tp.url} (from output.elasticsearch.proxy_url)" in check.stdout, check.stdout
        d.terminate()
        # NO_PROXY lists the destination: straight there, the proxy sees nothing more
        before = tp.output().count("/_bulk")
        d2 = daemon_factory(cfg, env={"no_proxy": "127.0.0.1"})
        d2.wait_ready()
        t1 = time.monotonic()
        write_lines(logs / "app.log", range(150, 220))
        _arrive(es, "logs-*", 220, t1, d2.tail)
        assert tp.output().count("/_bulk") == before
        assert "reached through proxy" not in d2.cli("check").stdout
        es.assert_exactly_once(range(220), index="logs-*")
        assert d2.alive, d2.tail()


# ---------------------------------------------------------------- AWS SigV4

REGION = "eu-west-1"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYShipperKEY"


def _aws_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An AWS environment that finds nothing of the machine's own (no files, no metadata endpoint)."""
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
           "AWS_CONFIG_FILE": str(tmp_path / "no-config"), "AWS_EC2_METADATA_DISABLED": "true"}
    env.update(extra)
    return env


def _sigv4_config(tmp_path: Path, url: str, logs: Path, service: str = "es", **es: Any) -> Path:
    return write_config(tmp_path, es_url=url, paths=[logs / "*.log"],
                        extra_yaml={"output": {"elasticsearch": {"aws_sigv4": {"region": REGION, "service": service},
                                                                  **es}}})


def _static_key_front(front: FaultProxy, access_key: str) -> None:
    """The front verifies signatures made with `access_key` and AWS_SECRET, a long-term key."""
    authority = CredentialAuthority()
    authority.add_static(access_key, AWS_SECRET)
    front.require_sigv4(authority.lookup, REGION, "es")


def _ship_while_credentials_turn_over(d: Any, es: ES, logs: Path, authority: CredentialAuthority,
                                      index: str) -> list[int]:
    """Lines written steadily until three credentials have been handed out (refreshed while
    shipping); then every one arrives within the bound."""
    w = Writer(logs / "app.log", rate=200).start()
    try:
        wait_until(lambda: authority.issued >= 3, lambda: f"3 credentials handed out (have {authority.issued})\n"
                                                          f"{d.tail()}", timeout_s=60)
    finally:
        written = w.stop()
    t_end = time.monotonic()
    _arrive(es, index, len(written), t_end, d.tail)
    return written


def test_sigv4_with_credentials_from_the_environment_a_wrong_secret_refused_then_right(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    _static_key_front(fault_proxy, "AKIASHIPPERTEST00001")
    cfg = _sigv4_config(tmp_path, fault_proxy.url, logs)
    wrong = _aws_env(tmp_path, AWS_ACCESS_KEY_ID="AKIASHIPPERTEST00001", AWS_SECRET_ACCESS_KEY=AWS_SECRET[:-1] + "X")
    d = daemon_factory(cfg, env=wrong)
    d.wait_ready()
    write_lines(logs / "app.log", range(150))
    wait_until(lambda: len(fault_proxy.sigv4_refused) >= 2, lambda: f"refusals\n{d.tail()}")
    assert all("signature" in p for p in fault_proxy.sigv4_refused), fault_proxy.sigv4_refused
    assert _count(es, "logs-*") == 0
    d.terminate()
    fault_proxy.sigv4_refused.clear()
    d2 = daemon_factory(cfg, env=_aws_env(tmp_path, AWS_ACCESS_KEY_ID="AKIASHIPPERTEST00001",
                                          AWS_SECRET_ACCESS_KEY=AWS_SECRET))
    d2.wait_ready()
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(150, 200))
    _arrive(es, "logs-*", 200, t0, d2.tail)
    es.assert_exactly_once(range(200), index="logs-*")
    assert fault_proxy.sigv4_refused == [] and set(fault_proxy.sigv4_keys) == {"AKIASHIPPERTEST00001"}
    check = d2.cli("check")
    assert check.returncode == 0 and "ok (opensearch" in check.stdout, check.stdout + check.stderr
    for out in (d.output(), d2.output(), check.stdout, check.stderr):
        assert AWS_SECRET not in out and AWS_SECRET[:-1] not in out


def test_sigv4_with_a_profile_of_the_shared_credentials_file(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    _static_key_front(fault_proxy, "AKIASHIPPERPROFILE01")
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = AKIAWRONGDEFAULT0001\naws_secret_access_key = nope\n\n"
                     f"[shipper]\naws_access_key_id = AKIASHIPPERPROFILE01\naws_secret_access_key = {AWS_SECRET}\n")
    cfg = _sigv4_config(tmp_path, fault_proxy.url, logs)
    d = daemon_factory(cfg, env=_aws_env(tmp_path, AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_PROFILE="shipper"))
    d.wait_ready()
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(300))
    _arrive(es, "logs-*", 300, t0, d.tail)
    es.assert_exactly_once(range(300), index="logs-*")
    assert fault_proxy.sigv4_refused == [] and set(fault_proxy.sigv4_keys) == {"AKIASHIPPERPROFILE01"}
    assert AWS_SECRET not in d.output()


def test_sigv4_with_web_identity_irsa_refreshed_while_shipping(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    authority = CredentialAuthority(lifetime_s=4.0, grace_s=5.0)
    role = "arn:aws:iam::123456789012:role/shipper"
    token_file = tmp_path / "token"
    token_file.write_text("eyJhbGciOiJSUzI1NiJ9.service-account-token.sig")
    fault_proxy.require_sigv4(authority.lookup, REGION, "es")
    with FakeSts(authority, role, token_file.read_text()) as sts:
        cfg = _sigv4_config(tmp_path, fault_proxy.url, logs)
        d = daemon_factory(cfg, env=_aws_env(tmp_path, AWS_WEB_IDENTITY_TOKEN_FILE=str(token_file), AWS_ROLE_ARN=role,
                                             AWS_ROLE_SESSION_NAME="shipper", AWS_ENDPOINT_URL_STS=sts.url,
                                             AWS_REGION=REGION))
        d.wait_ready()
        written = _ship_while_credentials_turn_over(d, es, logs, authority, "logs-*")
        assert sts.calls >= 3
    es.assert_exactly_once(written, index="logs-*")
    assert fault_proxy.sigv4_refused == [], fault_proxy.sigv4_refused        # none signed with an expired one
    assert len(set(fault_proxy.sigv4_keys)) >= 3
    assert d.alive, d.tail()


def test_sigv4_with_ec2_instance_role_credentials_through_imdsv2(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    authority = CredentialAuthority(lifetime_s=3600.0)
    fault_proxy.require_sigv4(authority.lookup, REGION, "es")
    with FakeImds(authority) as imds:
        cfg = _sigv4_config(tmp_path, fault_proxy.url, logs)
        env = _aws_env(tmp_path, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url + "/")
        del env["AWS_EC2_METADATA_DISABLED"]
        d = daemon_factory(cfg, env=env)
        d.wait_ready()
        t0 = time.monotonic()
        write_lines(logs / "app.log", range(400))
        _arrive(es, "logs-*", 400, t0, d.tail)
        assert imds.calls >= 1
    es.assert_exactly_once(range(400), index="logs-*")
    assert fault_proxy.sigv4_refused == [] and len(set(fault_proxy.sigv4_keys)) == 1
    assert d.alive, d.tail()


def test_serverless_aoss_with_container_credentials_refreshed_and_no_document_ids(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    """OpenSearch Serverless, a time-series collection: `aoss` (x-amz-content-sha256 required),
    `document_id: none`, credentials of the ECS task's (or EKS Pod Identity's) role, refreshed."""
    logs = _logs(tmp_path)
    authority = CredentialAuthority(lifetime_s=4.0, grace_s=5.0)
    fault_proxy.require_sigv4(authority.lookup, REGION, "aoss")
    items: list[BulkItem] = []
    fault_proxy.item_failures(lambda item: items.append(item))
    with FakeEcs(authority) as ecs:
        cfg = _sigv4_config(tmp_path, fault_proxy.url, logs, service="aoss", document_id="none",
                            index="app-logs", index_template="off")
        d = daemon_factory(cfg, env=_aws_env(tmp_path, AWS_CONTAINER_CREDENTIALS_FULL_URI=ecs.url + "/v2/credentials/shipper",
                                             AWS_CONTAINER_AUTHORIZATION_TOKEN=ecs.auth_token))
        d.wait_ready()
        written = _ship_while_credentials_turn_over(d, es, logs, authority, "app-logs")
        assert ecs.calls >= 3
        check = d.cli("check")
    es.assert_exactly_once(written, index="app-logs")
    assert all(item.id is None for item in items)
    assert fault_proxy.sigv4_refused == [], fault_proxy.sigv4_refused
    assert "document_id: none: delivery is at least once" in check.stdout, check.stdout
    assert d.alive, d.tail()
