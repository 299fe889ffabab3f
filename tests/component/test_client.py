"""The sending side against a real loopback destination (FaultProxy + osmem, or a TLS server), with
fake time: Retry-After, backoff reset on success, per-item retries, 413 splitting, auth headers,
TLS verification, several hosts, once-per-episode logs, and requests overlapping under latency.

Sleeps advance a FakeClock, so backoff costs no real time and the test asserts the delays asked for.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from shipper.config import Config, ElasticsearchConfig, RetryConfig, TLSConfig
from shipper.errors import TransportError
from shipper.events import Events
from shipper.model import Attempt
from shipper.ship.bulk import split_pairs
from shipper.ship.sender import Sender
from tests.support.daemon import free_port
from tests.support.es import ES
from tests.support.fake_clock import FakeClock, RecordingEvents
from tests.support.proxy import FaultProxy
from tests.support.wait import async_wait_until


def _sender(hosts: list[str], clock: FakeClock | None = None, events: Events | None = None, **es: Any) -> Sender:
    es.setdefault("compression", "none")
    cfg = Config(output=ElasticsearchConfig(hosts=tuple(hosts), **es),
                 retry=RetryConfig(initial_backoff_s=0.1, max_backoff_s=30.0))
    return Sender(cfg, events or RecordingEvents(), clock or FakeClock(wall=1_000.0))


def _attempt(seqs: range | list[int], index: str = "t", pad: str = "") -> Attempt:
    body = b"".join(orjson.dumps({"create": {"_index": index, "_id": f"id-{n}"}}) + b"\n" +
                    orjson.dumps({"seq": n, "pad": pad}) + b"\n" for n in seqs)
    return Attempt(body, False, len(seqs))


def _seqs(es: ES, index: str = "t") -> list[int]:
    return sorted(d["_source"]["seq"] for d in es.all_docs(index))


async def _close(s: Sender) -> None:
    await s.client.close()


async def test_retry_after_is_honoured_and_backoff_resets_after_success(es: ES, fault_proxy: FaultProxy) -> None:
    clock = FakeClock(wall=1_000.0)
    ev = RecordingEvents()
    s = _sender([fault_proxy.url], clock, ev)
    try:
        fault_proxy.fail_next(429, times=2, retry_after=7)
        assert await s.deliver(_attempt(range(10))) == []
        assert clock.slept == [7.0, 7.0]                   # never earlier than the server asked
        assert ev.of("bulk_sent")[-1][1] == 200 and s.failures == 0

        fault_proxy.fail_next(503, times=4)
        assert await s.deliver(_attempt(range(10, 20))) == []
        delays = clock.slept[2:]
        assert delays[0] == pytest.approx(0.1)             # attempt 1: exactly initial_backoff
        assert [0.1 - 1e-9 <= d <= 0.1 * 2 ** i + 1e-9 for i, d in enumerate(delays)] == [True] * 4

        fault_proxy.fail_next(503, times=1)                # after a success: from the start again
        await s.deliver(_attempt(range(20, 30)))
        assert clock.slept[-1] == pytest.approx(0.1)
        assert _seqs(es) == list(range(30))
    finally:
        await _close(s)


async def test_failed_items_are_resent_alone_and_dead_ones_returned(es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.item_failures(lambda item: (429 if item.n in (3, 8) else
                                            (400, "mapper_parsing_exception", "failed to parse") if item.n == 5 else None))
    s = _sender([fault_proxy.url])
    try:
        dead = await s.deliver(_attempt(range(10)))
        assert [(d.status, orjson.loads(d.document)["seq"], d.index, d.doc_id) for d in dead] == [(400, 5, "t", "id-5")]
        assert dead[0].reason.startswith("mapper_parsing_exception")
        assert fault_proxy.items_seen == 12                # 10, then only the two 429s again
        assert _seqs(es) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    finally:
        await _close(s)


async def test_413_halves_until_it_fits_and_one_document_too_large_is_dead(es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.max_body(2500)
    s = _sender([fault_proxy.url])
    try:
        docs = list(range(40))
        body = _attempt(docs[:20]).body + _attempt([20], pad="x" * 4000).body + _attempt(docs[21:]).body
        dead = await s.deliver(Attempt(body, False, 40))
        assert [(d.status, orjson.loads(d.document)["seq"]) for d in dead] == [(413, 20)]
        assert "too large" in dead[0].reason
        assert _seqs(es) == [n for n in docs if n != 20]
        assert fault_proxy.by_status[413] >= 3
    finally:
        await _close(s)


async def test_gzip_bodies_are_split_and_resent_compressed(es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.reject_items(503, every_nth=4, times=3)
    s = _sender([fault_proxy.url], compression="gzip")
    try:
        a = await s.encode(split_pairs(_attempt(range(12)).body))
        assert a.gzipped
        assert await s.deliver(a) == []
        assert fault_proxy.last_headers["Content-Encoding"] == "gzip"
        assert _seqs(es) == list(range(12))
    finally:
        await _close(s)


async def test_api_key_and_basic_auth_headers(es: ES, fault_proxy: FaultProxy) -> None:
    s = _sender([fault_proxy.url], api_key="a2V5OnNlY3JldA==")
    try:
        await s.deliver(_attempt(range(2)))
        assert fault_proxy.last_headers["Authorization"] == "ApiKey a2V5OnNlY3JldA=="
    finally:
        await _close(s)
    fault_proxy.require_basic_auth("elastic", "pw:with@odd/chars")
    s = _sender([fault_proxy.url.replace("http://", "http://elastic:pw%3Awith%40odd%2Fchars@")])
    try:
        assert s.client.hosts[0].label == fault_proxy.url          # never the credentials
        await s.deliver(_attempt(range(2, 4)))
    finally:
        await _close(s)
    s = _sender([fault_proxy.url], username="elastic", password="pw:with@odd/chars")
    try:
        await s.deliver(_attempt(range(4, 6)))
    finally:
        await _close(s)
    assert fault_proxy.by_status.get(401, 0) == 0
    assert _seqs(es) == list(range(6))


async def test_401_is_logged_once_per_episode_with_the_host_and_recovers(es: ES, fault_proxy: FaultProxy,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    fault_proxy.require_basic_auth("elastic", "right-password")
    clock = FakeClock(wall=1_000.0)
    ev = RecordingEvents()
    s = _sender([fault_proxy.url], clock, ev, username="elastic", password="wrong-password")
    caplog.set_level(logging.INFO, logger="shipper.output")
    try:
        task = asyncio.create_task(s.deliver(_attempt(range(5))))
        await async_wait_until(lambda: fault_proxy.by_status.get(401, 0) >= 6,
                               lambda: f"six 401 answers (got {fault_proxy.by_status.get(401, 0)})")
        assert not task.done()
        assert s.up is False and "401" in (s.last_error or "")
        assert max(clock.slept) <= 30.0 and clock.slept[-1] > clock.slept[0]    # slower and slower, capped
        fault_proxy.require_basic_auth("elastic", "wrong-password")             # fixed on the cluster side
        assert await asyncio.wait_for(task, 10) == []
        assert s.up is True
    finally:
        await _close(s)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].host == fault_proxy.url and "credentials" in errors[0].getMessage()
    assert any(r.getMessage() == "output host recovered" for r in caplog.records)
    assert all("wrong-password" not in r.getMessage() and "wrong-password" not in str(r.__dict__)
               for r in caplog.records)
    assert [st[0] for st in ev.of("output_state")] == [False, True]
    assert _seqs(es) == list(range(5))


async def test_two_hosts_one_refusing_costs_no_sleep(es: ES, fault_proxy: FaultProxy) -> None:
    dead_url = f"http://127.0.0.1:{free_port()}"
    clock = FakeClock(wall=1_000.0)
    s = _sender([dead_url, fault_proxy.url], clock)
    try:
        for i in range(6):
            assert await s.deliver(_attempt(range(i * 10, i * 10 + 10))) == []
        assert clock.slept == []                       # the other host took every retry at once
        down = s.client.hosts[0]
        assert down.failures >= 1 and down.down_until > clock.now
        assert s.up is True
        assert _seqs(es) == list(range(60))
    finally:
        await _close(s)


async def test_one_host_refusing_backs_off_and_reports_down(fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.down()
    clock = FakeClock(wall=1_000.0)
    ev = RecordingEvents()
    s = _sender([fault_proxy.url], clock, ev)
    try:
        task = asyncio.create_task(s.deliver(_attempt(range(3))))
        await async_wait_until(lambda: len(clock.slept) >= 5,
                               lambda: f"five backoff sleeps while the host refuses (slept {clock.slept})")
        assert s.up is False and fault_proxy.url in (s.last_error or "")
        assert ev.of("retry_scheduled")[0][2] == fault_proxy.url
        fault_proxy.up()
        assert await asyncio.wait_for(task, 10) == []
        assert s.up is True and s.failures == 0
        assert _seqs(es) == [0, 1, 2]
    finally:
        await _close(s)


async def test_requests_overlap_under_latency_and_shrink_on_pushback(es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.latency(0.3)
    s = _sender([fault_proxy.url], max_in_flight=4)
    try:
        await asyncio.gather(*(s.deliver(_attempt(range(i * 5, i * 5 + 5))) for i in range(16)))
        assert s.peak_in_flight == 4
        assert s.limit.current == 4
        fault_proxy.latency(0)
        fault_proxy.fail_next(503, times=3)
        await asyncio.gather(*(s.deliver(_attempt(range(100 + i * 5, 100 + i * 5 + 5))) for i in range(4)))
        assert s.limit.slow_start is False and s.limit.current < 4 + 1
        assert len(_seqs(es)) == 100
    finally:
        await _close(s)


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return crt, key


async def _tls_server(crt: Path, key: Path) -> tuple[web.AppRunner, str]:
    async def bulk(req: web.Request) -> web.Response:
        n = (await req.read()).count(b"\n") // 2
        return web.json_response({"errors": False, "items": [{"create": {"status": 201}}] * n})

    app = web.Application()
    app.router.add_post("/_bulk", bulk)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(crt), str(key))
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
    await site.start()
    return runner, f"https://127.0.0.1:{port}"


async def test_tls_verify_and_ca_file(cert: tuple[Path, Path]) -> None:
    crt, key = cert
    runner, url = await _tls_server(crt, key)
    try:
        s = _sender([url], tls=TLSConfig(verify=True, ca_file=str(crt)))
        try:
            assert await s.deliver(_attempt(range(3))) == []
        finally:
            await _close(s)
        s = _sender([url], tls=TLSConfig(verify=False))
        try:
            assert await s.deliver(_attempt(range(3))) == []
        finally:
            await _close(s)
        s = _sender([url], tls=TLSConfig(verify=True))           # an unknown CA is refused, never ignored
        try:
            res = await s.post(_attempt(range(3)))
            assert isinstance(res, TransportError) and "certificate" in str(res).lower()
        finally:
            await _close(s)
    finally:
        await runner.cleanup()
