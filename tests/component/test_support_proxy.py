"""The fault-injecting proxy against a real osmem clone: forwarding, each fault, sync and async use."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest

from tests.support.es import ES
from tests.support.proxy import FaultProxy, apply_filter_path


def call(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read()


def bulk_body(seqs: range | list[int], index: str = "t") -> bytes:
    return b"".join(
        json.dumps({"create": {"_index": index, "_id": f"id-{s}"}}).encode() + b"\n" + json.dumps({"seq": s}).encode() + b"\n"
        for s in seqs
    )


def post_bulk(proxy: FaultProxy, body: bytes, *, gz: bool = False, query: str = "") -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": "application/x-ndjson"}
    if gz:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    status, hdrs, data = call(f"{proxy.url}/_bulk{query}", "POST", body, headers)
    return status, hdrs, json.loads(data) if data else None


def test_forwards_gzip_bulk_verbatim_and_counts(fault_proxy: FaultProxy, es: ES) -> None:
    raw = bulk_body(range(50))
    status, headers, answer = post_bulk(fault_proxy, raw, gz=True)
    assert status == 200 and answer["errors"] is False and len(answer["items"]) == 50
    assert headers.get("X-Elastic-Product") == "Elasticsearch"
    assert es.count() == 50
    assert fault_proxy.requests == 1 and fault_proxy.forwarded == 1
    assert fault_proxy.by_status == {200: 1}
    assert fault_proxy.bodies_seen == len(gzip.compress(raw))  # the wire size, compressed
    assert fault_proxy.last_headers["content-encoding"] == "gzip"

    status, _, data = call(f"{fault_proxy.url}/t/_count")
    assert status == 200 and json.loads(data)["count"] == 50


def test_fail_next_answers_without_forwarding(fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.fail_next(503, times=2, retry_after=3)
    fault_proxy.fail_next(429, body=b"too many")
    for expected in (503, 503):
        status, headers, answer = post_bulk(fault_proxy, bulk_body(range(3)))
        assert status == expected and headers["Retry-After"] == "3"
        assert answer["error"]["type"] == "unavailable_shards_exception" and answer["status"] == 503
    status, _, data = call(f"{fault_proxy.url}/_bulk", "POST", bulk_body(range(3)), {"Content-Type": "application/x-ndjson"})
    assert (status, data) == (429, b"too many")
    assert es.count() == 0 and fault_proxy.forwarded == 0
    status, _, answer = post_bulk(fault_proxy, bulk_body(range(3)))
    assert status == 200 and es.count() == 3
    assert fault_proxy.by_status == {503: 2, 429: 1, 200: 1}


def test_fail_ratio_is_deterministic_per_seed(fault_proxy: FaultProxy) -> None:
    def pattern() -> list[int]:
        return [call(f"{fault_proxy.url}/")[0] for _ in range(20)]

    fault_proxy.fail_ratio(429, 0.5, retry_after=1, seed=7)
    first = pattern()
    fault_proxy.fail_ratio(429, 0.5, retry_after=1, seed=7)
    assert pattern() == first
    assert 3 <= first.count(429) <= 17 and set(first) == {200, 429}
    fault_proxy.fail_ratio(429, 0)
    assert set(pattern()) == {200}


def test_down_refuses_connections_and_up_reopens_same_port(fault_proxy: FaultProxy) -> None:
    port = fault_proxy.port
    assert call(f"{fault_proxy.url}/")[0] == 200
    fault_proxy.down()
    with pytest.raises(urllib.error.URLError) as exc:
        call(f"{fault_proxy.url}/")
    assert isinstance(exc.value.reason, ConnectionRefusedError)
    fault_proxy.up()
    assert fault_proxy.port == port
    assert call(f"{fault_proxy.url}/")[0] == 200


async def test_down_drops_keepalive_connections_for_async_clients(fault_proxy: FaultProxy) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{fault_proxy.url}/") as resp:
            assert resp.status == 200
            await resp.read()
        fault_proxy.down()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get(f"{fault_proxy.url}/") as resp:
                await resp.read()
        fault_proxy.up()
        fault_proxy.fail_next(502)
        async with session.get(f"{fault_proxy.url}/") as resp:
            assert resp.status == 502
        async with session.get(f"{fault_proxy.url}/") as resp:
            assert resp.status == 200


def test_down_on_a_busy_loop_drops_the_connection_waiting_to_be_accepted(fault_proxy: FaultProxy) -> None:
    # A loaded machine: the proxy's loop is busy while a client connects (the kernel completes the
    # handshake and holds the request) and down() is called, so its accept and down() share a loop
    # turn. The connection must end at once, not stay open unread until the client's timeout.
    fault_proxy.stall(0.5)
    with socket.create_connection((fault_proxy.host, fault_proxy.port), timeout=5) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: proxy\r\n\r\n")
        fault_proxy.down()                         # runs once the stall ends
        t0 = time.monotonic()
        try:
            data = c.recv(1024)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            pytest.fail("the connection accepted as the proxy went down was left open, never answered")
        assert data == b"" and time.monotonic() - t0 < 2.0   # closed, not served
    assert fault_proxy.requests == 0
    fault_proxy.up()
    assert call(f"{fault_proxy.url}/")[0] == 200


async def test_reset_next_drops_the_connection_without_an_answer(fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.reset_next(1)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with session.post(f"{fault_proxy.url}/_bulk", data=bulk_body(range(2)),
                                    headers={"Content-Type": "application/x-ndjson"}) as resp:
                await resp.read()
        async with session.get(f"{fault_proxy.url}/") as resp:    # only the next one
            assert resp.status == 200
    assert fault_proxy.requests == 2 and fault_proxy.forwarded == 1
    assert es.count() == 0


async def _wait_hanging(proxy: FaultProxy, n: int) -> None:
    deadline = time.monotonic() + 5
    while proxy.hanging != n:
        assert time.monotonic() < deadline, f"expected {n} hanging request(s), saw {proxy.hanging}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("forward", [False, True])
async def test_hang_next_holds_one_request_while_later_ones_are_answered_until_down(
        fault_proxy: FaultProxy, es: ES, forward: bool) -> None:
    fault_proxy.hang_next(1, forward=forward)
    headers = {"Content-Type": "application/x-ndjson"}
    async with aiohttp.ClientSession() as hung_session, aiohttp.ClientSession() as session:
        async def hung() -> int:
            async with hung_session.post(f"{fault_proxy.url}/_bulk?refresh=true", data=bulk_body(range(2)),
                                         headers=headers) as resp:
                await resp.read()
                return resp.status

        task = asyncio.create_task(hung())
        await _wait_hanging(fault_proxy, 1)
        async with session.post(f"{fault_proxy.url}/_bulk", data=bulk_body(range(2, 4)), headers=headers) as resp:
            assert resp.status == 200              # a later request is answered meanwhile
        assert not task.done()
        assert es.count() == (4 if forward else 2)    # forward: indexed, only the answer is withheld
        t0 = time.monotonic()
        await asyncio.to_thread(fault_proxy.down)
        with pytest.raises(aiohttp.ClientConnectionError):
            await asyncio.wait_for(task, 5)
        assert time.monotonic() - t0 < 2.0
        assert fault_proxy.hanging == 0
        fault_proxy.up()
        async with session.get(f"{fault_proxy.url}/") as resp:    # hang_next(1): only one
            assert resp.status == 200


def test_latency_delays_answers(fault_proxy: FaultProxy) -> None:
    fault_proxy.latency(0.3)
    t0 = time.monotonic()
    assert call(f"{fault_proxy.url}/")[0] == 200
    assert time.monotonic() - t0 >= 0.29
    fault_proxy.latency(0)


def test_max_body_measures_the_compressed_wire_size(fault_proxy: FaultProxy, es: ES) -> None:
    raw = bulk_body(range(200))
    compressed = gzip.compress(raw)
    assert len(compressed) < len(raw) // 3
    fault_proxy.max_body(len(compressed) + 10)
    assert post_bulk(fault_proxy, raw, gz=True)[0] == 200
    status, _, data = call(f"{fault_proxy.url}/_bulk", "POST", bulk_body(range(200, 400)), {"Content-Type": "application/x-ndjson"})
    assert status == 413
    assert es.count() == 200


def test_basic_auth(fault_proxy: FaultProxy) -> None:
    fault_proxy.require_basic_auth("elastic", "s3cret")
    status, headers, data = call(f"{fault_proxy.url}/")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
    assert json.loads(data)["error"]["type"] == "security_exception"
    wrong = "Basic " + base64.b64encode(b"elastic:nope").decode()
    assert call(f"{fault_proxy.url}/", headers={"Authorization": wrong})[0] == 401
    right = "Basic " + base64.b64encode(b"elastic:s3cret").decode()
    assert call(f"{fault_proxy.url}/", headers={"Authorization": right})[0] == 200
    fault_proxy.require_basic_auth(None)
    assert call(f"{fault_proxy.url}/")[0] == 200


@pytest.mark.parametrize("gz", [False, True])
def test_reject_items_strips_them_from_the_forwarded_body(fault_proxy: FaultProxy, es: ES, gz: bool) -> None:
    fault_proxy.reject_items(429, every_nth=3)
    status, _, answer = post_bulk(fault_proxy, bulk_body(range(9)), gz=gz)
    assert status == 200 and answer["errors"] is True
    statuses = [item["create"]["status"] for item in answer["items"]]
    assert statuses == [201, 201, 429] * 3
    rejected = [item["create"] for item in answer["items"] if item["create"]["status"] == 429]
    assert [r["_id"] for r in rejected] == ["id-2", "id-5", "id-8"]
    assert rejected[0]["error"]["type"] == "es_rejected_execution_exception" and rejected[0]["_index"] == "t"
    assert sorted(es.ids()) == sorted(f"id-{s}" for s in (0, 1, 3, 4, 6, 7))
    assert fault_proxy.items_failed == 3

    # Re-sending only the failed items gets them in eventually (the item count runs on).
    pending = [2, 5, 8]
    for _ in range(5):
        if not pending:
            break
        _, _, answer = post_bulk(fault_proxy, bulk_body(pending), gz=gz)
        pending = [s for s, it in zip(pending, answer["items"]) if it["create"]["status"] == 429]
    assert not pending
    es.assert_exactly_once(range(9))


def test_reject_items_keeps_filter_path(fault_proxy: FaultProxy) -> None:
    fault_proxy.reject_items(429, every_nth=2)
    status, _, answer = post_bulk(fault_proxy, bulk_body(range(4)), query="?filter_path=errors,items.*.status")
    assert status == 200
    assert answer == {"errors": True, "items": [{"create": {"status": s}} for s in (201, 429, 201, 429)]}


def test_item_failures_hook_with_custom_errors(fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.item_failures(
        lambda item: (400, "mapper_parsing_exception", "failed to parse") if item.id == "id-1" else None
    )
    _, _, answer = post_bulk(fault_proxy, bulk_body(range(3)))
    assert [i["create"]["status"] for i in answer["items"]] == [201, 400, 201]
    assert answer["items"][1]["create"]["error"]["type"] == "mapper_parsing_exception"
    fault_proxy.item_failures(lambda item: 503)  # every item fails: nothing is forwarded
    forwarded = fault_proxy.forwarded
    _, _, answer = post_bulk(fault_proxy, bulk_body(range(10, 12)))
    assert [i["create"]["status"] for i in answer["items"]] == [503, 503]
    assert fault_proxy.forwarded == forwarded
    assert sorted(es.ids()) == ["id-0", "id-2"]


def test_blocked_answers_every_item_with_cluster_block(fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.blocked(True)
    status, _, answer = post_bulk(fault_proxy, bulk_body(range(4)), gz=True)
    assert status == 200 and answer["errors"] is True
    for item in answer["items"]:
        assert item["create"]["status"] == 403
        assert item["create"]["error"]["type"] == "cluster_block_exception"
    assert call(f"{fault_proxy.url}/")[0] == 200  # not a bulk: passes
    assert es.count() == 0
    fault_proxy.blocked(False)
    assert post_bulk(fault_proxy, bulk_body(range(4)), gz=True)[2]["errors"] is False
    assert es.count() == 4


def test_upstream_gone_is_a_502(osmem_clone: Any) -> None:
    with FaultProxy("http://127.0.0.1:9") as proxy:
        status, headers, _ = call(f"{proxy.url}/")
        assert status == 502 and headers["X-Fault-Proxy"] == "upstream-error"
        assert proxy.forwarded == 0


def test_apply_filter_path() -> None:
    doc = {"took": 3, "errors": True, "items": [{"create": {"status": 201, "_id": "a"}}, {"index": {"status": 429}}]}
    assert apply_filter_path(doc, "errors,items.*.status") == {
        "errors": True, "items": [{"create": {"status": 201}}, {"index": {"status": 429}}]
    }
    assert apply_filter_path(doc, "took") == {"took": 3}
    assert apply_filter_path(doc, "nothing") == {}


async def test_concurrent_async_clients_under_faults_end_exactly_once(fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.fail_ratio(503, 0.3, seed=1)
    fault_proxy.reject_items(429, every_nth=4)

    async def ship(session: aiohttp.ClientSession, seqs: list[int]) -> None:
        pending = seqs
        for _ in range(50):
            body = gzip.compress(bulk_body(pending))
            headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
            async with session.post(f"{fault_proxy.url}/_bulk", data=body, headers=headers) as resp:
                if resp.status != 200:
                    continue
                items = (await resp.json())["items"]
            pending = [s for s, it in zip(pending, items) if it["create"]["status"] not in (201, 409)]
            if not pending:
                return
        raise AssertionError(f"still pending: {pending}")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(ship(session, list(range(i * 25, i * 25 + 25))) for i in range(8)))
    es.assert_exactly_once(range(200))
    assert fault_proxy.by_status[503] > 0 and fault_proxy.items_failed > 0
