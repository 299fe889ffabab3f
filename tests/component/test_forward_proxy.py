"""The output's client through a scripted forward proxy on 127.0.0.1: what goes on the wire (the
CONNECT request, absolute-form requests, Proxy-Authorization), and every way a proxy refuses or
breaks a tunnel is a retryable TransportError that never shows the proxy's password.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable

import pytest

from shipper.config import ElasticsearchConfig
from shipper.errors import TransportError
from shipper.logs import redact
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient

PASSWORD = "Tunnel-Walrus-42"
BULK_OK = b'{"errors":false,"items":[{"create":{"status":201}}]}'
BODY = b'{"create":{"_index":"t","_id":"i-1"}}\n{"m":1}\n'

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]


class ScriptedProxy:
    """Reads one request head per connection, records it, and lets `script` answer."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedProxy:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    self.heads.append(head)
                    await self.script(reader, writer, head)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def _client(url: str, proxy_port: int) -> BulkClient:
    proxy = f"http://shipper:{PASSWORD}@127.0.0.1:{proxy_port}"
    cfg = ElasticsearchConfig(hosts=(url,), compression="none", timeout_s=5.0, proxy_url=proxy,
                              host_proxies=(("output.elasticsearch.proxy_url", proxy),))
    return BulkClient(cfg, Backoff(0.1, 1.0))


AUTH = "Basic " + base64.b64encode(f"shipper:{PASSWORD}".encode()).decode()


async def test_http_goes_in_absolute_form_with_proxy_authorization_on_a_kept_connection() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(BULK_OK), BULK_OK))

    async with ScriptedProxy(answer) as proxy:
        client = _client("http://es.internal:9200/prefix", proxy.port)
        try:
            for _ in range(2):
                reply = await client.post_bulk(BODY, False)
                assert reply.status == 200 and reply.answer == {"errors": False}
        finally:
            await client.close()
    assert len(proxy.heads) == 2
    for head in proxy.heads:
        lines = head.decode().split("\r\n")
        assert lines[0].startswith("POST http://es.internal:9200/prefix/_bulk?filter_path=") and lines[0].endswith(" HTTP/1.1")
        assert "Host: es.internal:9200" in lines and f"Proxy-Authorization: {AUTH}" in lines


async def test_https_asks_for_a_tunnel_to_the_destination_by_name() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\n\r\nforbidden")
        await writer.drain()
        writer.close()

    async with ScriptedProxy(refuse) as proxy:
        client = _client("https://es.example.com:9243", proxy.port)
        try:
            with pytest.raises(TransportError) as e:
                await client.post_bulk(BODY, False)
        finally:
            await client.close()
    assert proxy.heads[0] == (b"CONNECT es.example.com:9243 HTTP/1.1\r\nHost: es.example.com:9243\r\n"
                              b"Proxy-Authorization: " + AUTH.encode() + b"\r\n\r\n")
    assert e.value.retryable and "refused CONNECT to es.example.com:9243: HTTP/1.1 403 Forbidden" in str(e.value)


async def _closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
    writer.close()


async def _accepts_then_drops(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await reader.read(1)          # the ClientHello's first byte: then the tunnel breaks
    writer.transport.abort()


async def _answers_407(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
    writer.write(b'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="corp"\r\n'
                 b"Content-Length: 0\r\n\r\n")


async def _not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
    writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")


@pytest.mark.parametrize("script, scheme, words", [
    (_closes, "https", "closed the connection before it answered CONNECT"),
    (_accepts_then_drops, "https", ""),
    (_answers_407, "https", "HTTP/1.1 407 Proxy Authentication Required (check the user and password"),
    (_answers_407, "http", "HTTP 407 (proxy authentication required"),
    (_not_http, "https", "answered CONNECT with no HTTP"),
])
async def test_a_proxy_that_refuses_or_breaks_the_tunnel_is_a_retryable_error(
        script: Script, scheme: str, words: str) -> None:
    async with ScriptedProxy(script) as proxy:
        client = _client(f"{scheme}://es.example.com:9200", proxy.port)
        try:
            for _ in range(2):          # and again: nothing is left half-open in the pool
                with pytest.raises(TransportError) as e:
                    await client.post_bulk(BODY, False)
                assert e.value.retryable and words in str(e.value), e.value
                assert PASSWORD not in str(e.value) and PASSWORD not in redact(repr(e.value))
        finally:
            await client.close()
        assert client.hosts[0].failures == 2


async def test_sigv4_without_any_credentials_is_a_retryable_error_naming_the_chain(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """botocore's chain finds nothing (no variables, no files, metadata off): the request is not
    sent, and the error says where credentials are looked for; found later, it goes."""
    from shipper.config import AwsSigV4Config

    for name in [k for k in __import__("os").environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        seen.append(head)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BULK_OK), BULK_OK))

    async with ScriptedProxy(answer) as server:       # here the scripted server is the destination
        cfg = ElasticsearchConfig(hosts=(f"http://127.0.0.1:{server.port}",), compression="none",
                                  aws_sigv4=AwsSigV4Config("eu-west-1", "es"))
        client = BulkClient(cfg, Backoff(0.1, 1.0))
        try:
            with pytest.raises(TransportError) as e:
                await client.post_bulk(BODY, False)
            assert e.value.retryable and "AWS credentials: none found" in str(e.value), e.value
            assert seen == []
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIALATERLATERLATER1")
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PASSWORD)
            reply = await client.post_bulk(BODY, False)
            assert reply.status == 200
        finally:
            await client.close()
    head = seen[0].decode()
    assert "Authorization: AWS4-HMAC-SHA256 Credential=AKIALATERLATERLATER1/" in head
    assert "/_bulk?filter_path=errors%2Citems.%2A.status" in head and "X-Amz-Content-SHA256: " in head
    assert PASSWORD not in head
