"""TLS on the output against a real TLS server on 127.0.0.1 (aiohttp, certificates made here by the
`openssl` CLI): client certificates, the CA pinned by SHA-256 fingerprint, `tls.verify: false`.

Every failure must be a clear, retryable TransportError: the documents stay with the sender (and, in
the daemon, in the spool) and arrive exactly once when the cause is fixed. Time is a FakeClock.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from shipper.config import Config, ElasticsearchConfig, RetryConfig, TLSConfig, load_config_text
from shipper.errors import ConfigError, TransportError
from shipper.model import Attempt
from shipper.ship import tls as tlsmod
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient
from shipper.ship.sender import Sender
from tests.support.daemon import free_port
from tests.support.fake_clock import FakeClock, RecordingEvents
from tests.support.pki import make_ca as _ca
from tests.support.pki import make_leaf as _leaf
from tests.support.wait import async_wait_until


def _clock() -> FakeClock:
    """The shared fake clock, its wall time tied to its monotonic time (as these tests expect)."""
    return FakeClock(wall=1_000.0)


def _retry_reasons(ev: RecordingEvents) -> list[str]:
    return [reason for reason, _, _ in ev.of("retry_scheduled")]


# ---------------------------------------------------------------- certificates (openssl CLI)

@dataclass
class Pki:
    dir: Path
    files: dict[str, Path] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Path:
        return self.files[name]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Two server CAs (the server presents a chain of one of them, CA included, as Elasticsearch 8
    does), a client CA with a client certificate, and a client certificate from an unknown CA."""
    d = tmp_path_factory.mktemp("pki")
    p = Pki(d)
    server_ext = "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
    for ca_name in ("http-ca", "other-ca"):
        ca = _ca(d, ca_name)
        srv = _leaf(d, f"server-{ca_name}", ca, server_ext)
        chain = d / f"server-{ca_name}-chain.pem"
        chain.write_bytes(srv[0].read_bytes() + ca[0].read_bytes())
        p.files.update({ca_name: ca[0], f"{ca_name}.key": ca[1], f"server-{ca_name}": chain,
                        f"server-{ca_name}.key": srv[1], f"server-{ca_name}.leaf": srv[0]})
    client_ca = _ca(d, "client-ca")
    good = _leaf(d, "client-good", client_ca, client_ext)
    rogue_ca = _ca(d, "rogue-ca")
    bad = _leaf(d, "client-bad", rogue_ca, client_ext)
    p.files.update({"client-ca": client_ca[0], "rogue-ca": rogue_ca[0], "client-good": good[0],
                    "client-good.key": good[1], "client-bad": bad[0], "client-bad.key": bad[1]})
    return p


def sha256_of(pem: Path) -> str:
    der = ssl.PEM_cert_to_DER_cert(pem.read_text())
    return hashlib.sha256(der).hexdigest()


# ---------------------------------------------------------------- the server

class TLSServer:
    """An HTTPS bulk endpoint remembering every `_id` it stored; its context can change while it runs."""

    def __init__(self, pki: Pki, ca_name: str = "http-ca", client_ca: str | None = None) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(str(pki[f"server-{ca_name}"]), str(pki[f"server-{ca_name}.key"]))
        if client_ca is not None:
            self.ctx.verify_mode = ssl.CERT_REQUIRED
            self.ctx.load_verify_locations(str(pki[client_ca]))
        self.ids: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> TLSServer:
        async def bulk(req: web.Request) -> web.Response:
            lines = (await req.read()).split(b"\n")
            items = []
            for action in lines[0::2]:
                if action:
                    meta = orjson.loads(action)["create"]
                    self.ids.append(meta["_id"])
                    items.append({"create": {"status": 201}})
            return web.json_response({"errors": False, "items": items})

        async def root(req: web.Request) -> web.Response:
            return web.json_response({"version": {"number": "8.15.0", "build_flavor": "default"},
                                      "tagline": "You Know, for Search"})

        app = web.Application()
        app.router.add_post("/_bulk", bulk)
        app.router.add_get("/", root)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port, ssl_context=self.ctx).start()
        self.url = f"https://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def _sender(url: str, tls: TLSConfig, events: RecordingEvents | None = None, clock: FakeClock | None = None) -> Sender:
    cfg = Config(output=ElasticsearchConfig(hosts=(url,), compression="none", tls=tls),
                 retry=RetryConfig(initial_backoff_s=0.1, max_backoff_s=30.0))
    return Sender(cfg, events or RecordingEvents(), clock or _clock())


def _attempt(n: int) -> Attempt:
    body = b"".join(orjson.dumps({"create": {"_index": "t", "_id": f"id-{i}"}}) + b"\n" +
                    orjson.dumps({"seq": i}) + b"\n" for i in range(n))
    return Attempt(body, False, n)


async def _wait_retries(ev: RecordingEvents, n: int, what: str, timeout_s: float = 20.0) -> None:
    await async_wait_until(lambda: len(_retry_reasons(ev)) >= n,
                           lambda: f"{what}; retries: {_retry_reasons(ev)[-3:]}", timeout_s, interval_s=0.01)


# ---------------------------------------------------------------- pure parts

def test_fingerprint_forms_and_ca_detection(pki: Pki) -> None:
    ca_der = ssl.PEM_cert_to_DER_cert(pki["http-ca"].read_text())
    leaf_der = ssl.PEM_cert_to_DER_cert(pki["server-http-ca.leaf"].read_text())
    assert tlsmod.is_ca(ca_der) and not tlsmod.is_ca(leaf_der)
    hexed = hashlib.sha256(ca_der).hexdigest()
    # what openssl prints (colons, upper case) and what Elasticsearch 8 prints (plain hex) are one pin
    out = subprocess.run(["openssl", "x509", "-in", str(pki["http-ca"]), "-noout", "-fingerprint", "-sha256"],
                         check=True, capture_output=True, text=True).stdout
    colon_form = out.strip().split("=", 1)[1]
    for form in (colon_form, hexed, hexed.upper(), colon_form.lower()):
        cfg = load_config_text(f"output:\n  elasticsearch:\n    hosts: ['https://127.0.0.1:9200']\n"
                               f"    tls: {{ca_fingerprint: '{form}'}}\n")
        assert cfg.output.tls.ca_fingerprint == hexed
    assert tlsmod.colon_hex(hexed) == colon_form
    assert tlsmod.pick_pinned_ca([leaf_der, ca_der], hexed).ca_der == ca_der
    verdict = tlsmod.pick_pinned_ca([leaf_der, ca_der], hashlib.sha256(leaf_der).hexdigest())
    assert verdict.ca_der is None and "not a CA certificate" in (verdict.error or "")
    verdict = tlsmod.pick_pinned_ca([leaf_der], hexed)
    assert verdict.ca_der is None and "no certificate the server sent matches" in (verdict.error or "")


@pytest.mark.parametrize("tls_yaml, key, words", [
    ("{ca_fingerprint: 'abc'}", "output.elasticsearch.tls.ca_fingerprint", "64 hex digits"),
    ("{verify: false, ca_fingerprint: '" + "ab" * 32 + "'}", "output.elasticsearch.tls.ca_fingerprint", "verify: true"),
    ("{key_file: KEY}", "output.elasticsearch.tls.key_file", "cert_file is not"),
    ("{cert_file: /nonexistent.pem}", "output.elasticsearch.tls.cert_file", "file not found"),
    ("{cert_file: GOOD, key_file: BADKEY}", "output.elasticsearch.tls.key_file", "cannot load"),
])
def test_tls_config_errors_name_the_key(pki: Pki, tls_yaml: str, key: str, words: str) -> None:
    tls_yaml = (tls_yaml.replace("BADKEY", str(pki["client-bad.key"])).replace("KEY", str(pki["client-good.key"]))
                .replace("GOOD", str(pki["client-good"])))
    with pytest.raises(ConfigError) as e:
        load_config_text(f"output:\n  elasticsearch:\n    tls: {tls_yaml}\n")
    assert e.value.key == key and words in e.value.message and e.value.line is not None


# ---------------------------------------------------------------- on the wire

async def test_client_certificate_good_is_delivered(pki: Pki) -> None:
    async with TLSServer(pki, client_ca="client-ca") as srv:
        s = _sender(srv.url, TLSConfig(ca_file=str(pki["http-ca"]), cert_file=str(pki["client-good"]),
                                       key_file=str(pki["client-good.key"])))
        try:
            assert await s.deliver(_attempt(5)) == []
        finally:
            await s.client.close()
        assert srv.ids == [f"id-{i}" for i in range(5)]


async def test_wrong_client_certificate_is_a_clear_retryable_error_and_resumes_when_trusted(pki: Pki) -> None:
    async with TLSServer(pki, client_ca="client-ca") as srv:
        ev, clock = RecordingEvents(), _clock()
        s = _sender(srv.url, TLSConfig(ca_file=str(pki["http-ca"]), cert_file=str(pki["client-bad"]),
                                       key_file=str(pki["client-bad.key"])), ev, clock)
        try:
            res = await s.post(_attempt(3))
            assert isinstance(res, TransportError) and res.retryable
            # an asyncio server drops the connection without its alert; Elasticsearch sends one
            assert "refused the client certificate tls.cert_file" in str(res), str(res)
            assert srv.ids == []
            delivery = asyncio.create_task(s.deliver(_attempt(3)))
            await _wait_retries(ev, 3, "retries with the refused client certificate")
            assert not delivery.done() and srv.ids == []
            before_fix = _retry_reasons(ev)
            srv.ctx.load_verify_locations(str(pki["rogue-ca"]))     # the fix: the server trusts its CA
            assert await asyncio.wait_for(delivery, 20) == []
            assert srv.ids == ["id-0", "id-1", "id-2"]               # nothing lost, nothing twice
            assert all("client certificate" in r for r in before_fix), before_fix
        finally:
            await s.client.close()


async def test_missing_client_certificate_says_to_set_one(pki: Pki) -> None:
    async with TLSServer(pki, client_ca="client-ca") as srv:
        s = _sender(srv.url, TLSConfig(ca_file=str(pki["http-ca"])))
        try:
            res = await s.post(_attempt(1))
            assert isinstance(res, TransportError) and res.retryable
            assert "requires a client certificate" in str(res) and "set tls.cert_file" in str(res), str(res)
        finally:
            await s.client.close()


async def test_pinned_ca_fingerprint_is_trusted_with_host_name_checked(pki: Pki) -> None:
    async with TLSServer(pki) as srv:
        # no ca_file: the system CAs do not know http-ca; only the pin makes it trusted
        s = _sender(srv.url, TLSConfig(ca_fingerprint=sha256_of(pki["http-ca"])))
        try:
            assert await s.deliver(_attempt(4)) == []
            assert await s.deliver(_attempt(4)) == []                # the pin holds for later connections
            assert (await s.client.probe())[0][1] is True
        finally:
            await s.client.close()
        assert srv.ids == [f"id-{i}" for i in range(4)] * 2


async def test_fingerprint_mismatch_is_clear_nothing_lost_and_resumes_when_the_server_presents_the_pinned_ca(
        pki: Pki) -> None:
    async with TLSServer(pki, ca_name="other-ca") as srv:
        ev, clock = RecordingEvents(), _clock()
        s = _sender(srv.url, TLSConfig(ca_fingerprint=sha256_of(pki["http-ca"])), ev, clock)
        try:
            res = await s.post(_attempt(2))
            assert isinstance(res, TransportError) and res.retryable
            assert "no certificate the server sent matches tls.ca_fingerprint" in str(res), str(res)
            assert tlsmod.colon_hex(sha256_of(pki["other-ca"])) in str(res)       # says what it did see
            delivery = asyncio.create_task(s.deliver(_attempt(2)))
            await _wait_retries(ev, 3, "retries on the fingerprint mismatch")
            assert srv.ids == []
            srv.ctx.load_cert_chain(str(pki["server-http-ca"]), str(pki["server-http-ca.key"]))
            assert await asyncio.wait_for(delivery, 20) == []
            assert srv.ids == ["id-0", "id-1"]
        finally:
            await s.client.close()


async def test_pinned_then_certificate_changes_to_another_ca_is_refused(pki: Pki) -> None:
    """A pin is no blank cheque: once the server's chain no longer verifies, the chain is read again."""
    async with TLSServer(pki) as srv:
        s = _sender(srv.url, TLSConfig(ca_fingerprint=sha256_of(pki["http-ca"])))
        try:
            assert await s.deliver(_attempt(1)) == []
            srv.ctx.load_cert_chain(str(pki["server-other-ca"]), str(pki["server-other-ca.key"]))
            await s.client.close()                                    # no kept-alive connection to reuse
            first = await s.post(_attempt(1))
            assert isinstance(first, TransportError) and "not trusted" in str(first), str(first)
            second = await s.post(_attempt(1))
            assert isinstance(second, TransportError) and "matches tls.ca_fingerprint" in str(second), str(second)
        finally:
            await s.client.close()


async def test_unknown_ca_without_pin_says_which_setting(pki: Pki) -> None:
    async with TLSServer(pki) as srv:
        s = _sender(srv.url, TLSConfig())
        try:
            res = await s.post(_attempt(1))
            assert isinstance(res, TransportError) and res.retryable
            assert "not trusted" in str(res) and "tls.ca_file or tls.ca_fingerprint" in str(res), str(res)
        finally:
            await s.client.close()


async def test_verify_false_is_a_warning_at_start_and_still_ships(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    async with TLSServer(pki) as srv:
        with caplog.at_level(logging.WARNING, logger="shipper.output"):
            s = _sender(srv.url, TLSConfig(verify=False))
        warnings = [r for r in caplog.records if "TLS verification is off" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        try:
            assert await s.deliver(_attempt(2)) == []
        finally:
            await s.client.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shipper.output"):
        BulkClient(ElasticsearchConfig(hosts=("https://127.0.0.1:1",)), Backoff(1.0, 2.0))
        BulkClient(ElasticsearchConfig(hosts=("http://127.0.0.1:1",), tls=TLSConfig(verify=False)), Backoff(1.0, 2.0))
    assert not [r for r in caplog.records if "TLS verification is off" in r.getMessage()]




async def test_a_server_that_sends_its_alert_gets_the_precise_reason(pki: Pki) -> None:
    """A blocking OpenSSL server (as Elasticsearch's Netty) sends its alert before closing: the
    diagnosis after the reset reads it and names the reason."""
    import socket
    import threading

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki["server-http-ca"]), str(pki["server-http-ca.key"]))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(str(pki["client-ca"]))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve(n: int) -> None:
        with listener:
            for _ in range(n):
                conn, _addr = listener.accept()
                with conn:
                    try:
                        with ctx.wrap_socket(conn, server_side=True) as tls_conn:
                            tls_conn.recv(1)
                    except (ssl.SSLError, OSError):
                        pass

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    bad = TLSConfig(ca_file=str(pki["http-ca"]), cert_file=str(pki["client-bad"]), key_file=str(pki["client-bad.key"]))
    none = TLSConfig(ca_file=str(pki["http-ca"]))
    found = await tlsmod.diagnose("127.0.0.1", port, tlsmod.client_context(bad), 5.0)
    assert found is not None
    assert tlsmod.describe_tls_error(found, bad) == (
        "TLS: the server refused the client certificate tls.cert_file (TLSV1_ALERT_UNKNOWN_CA); "
        "check that the server trusts its CA and that it is not expired")
    found = await tlsmod.diagnose("127.0.0.1", port, tlsmod.client_context(none), 5.0)
    assert found is not None
    assert "requires a client certificate (TLSV13_ALERT_CERTIFICATE_REQUIRED); set tls.cert_file" in (
        tlsmod.describe_tls_error(found, none) or "")
    await asyncio.to_thread(thread.join, 10)


async def test_the_pin_is_the_only_trust_anchor_on_every_new_connection(pki: Pki) -> None:
    """SPEC, Trust boundaries: once a CA in the chain matches, the connection is verified against that
    CA alone, on every new connection. Here `ca_file` trusts other-ca too: a server that moves to an
    other-ca chain after the pin (another server on that address, say) is refused at its next
    handshake, not accepted because some CA the context knows signed it (b19ade4 added the pin to
    the trusted CAs and looked at the chain once per host)."""
    async with TLSServer(pki) as srv:
        s = _sender(srv.url, TLSConfig(ca_file=str(pki["other-ca"]), ca_fingerprint=sha256_of(pki["http-ca"])))
        try:
            assert await s.deliver(_attempt(1)) == []
            srv.ctx.load_cert_chain(str(pki["server-other-ca"]), str(pki["server-other-ca.key"]))
            await s.client.close()                                    # the next request makes a new connection
            first = await s.post(_attempt(1))
            assert isinstance(first, TransportError) and first.retryable and "not trusted" in str(first), str(first)
            second = await s.post(_attempt(1))
            assert isinstance(second, TransportError) and "matches tls.ca_fingerprint" in str(second), str(second)
            assert srv.ids == ["id-0"]                                 # nothing reached the other-ca server
        finally:
            await s.client.close()


def test_a_pinned_context_trusts_nothing_before_the_pin_and_the_pin_alone_after(pki: Pki) -> None:
    ctx = tlsmod.client_context(TLSConfig(ca_file=str(pki["other-ca"]), ca_fingerprint=sha256_of(pki["http-ca"])))
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname and ctx.get_ca_certs() == []
    tlsmod.trust(ctx, ssl.PEM_cert_to_DER_cert(pki["http-ca"].read_text()))
    tlsmod.trust(ctx, ssl.PEM_cert_to_DER_cert(pki["http-ca"].read_text()))       # again: the same one store entry
    (only,) = ctx.get_ca_certs()
    assert "http-ca" in str(only["subject"]), only
