"""AWS on loopback for the SigV4 tests: a credential authority that hands out short-lived
credentials, and the endpoints botocore's chain asks for them: STS (AssumeRoleWithWebIdentity,
reached through AWS_ENDPOINT_URL_STS) EC2 instance metadata with IMDSv2 tokens (through
AWS_EC2_METADATA_SERVICE_ENDPOINT) and the ECS container endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI). The SigV4 front (tests/support/proxy.py's `require_sigv4`)
looks credentials up here.

(EC2 credentials are not refreshed on this clock: botocore extends an instance role's credentials
that expire within 12 to 20 minutes, its "static stability", so FakeImds hands out long-lived ones
in the tests.)

Short-lived, on a compressed clock: a credential lives `lifetime_s` (seconds, so a test sees
several), and the Expiration handed out is that plus 15 minutes, because the AWS SDKs refresh
15 minutes before an Expiration. The front refuses a credential once its lifetime and `grace_s`
are over: a shipper that does not refresh as the SDKs do stalls on 403s.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.sigv4 import Credential

SDK_REFRESH_MARGIN_S = 15 * 60


class CredentialAuthority:
    def __init__(self, lifetime_s: float = 4.0, grace_s: float = 3.0) -> None:
        self.lifetime_s = lifetime_s
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._creds: dict[str, Credential] = {}
        self.issued = 0

    def add_static(self, access_key: str, secret_key: str) -> None:
        with self._lock:
            self._creds[access_key] = Credential(secret_key)

    def issue(self) -> tuple[str, str, str, str]:
        """(access key, secret, token, Expiration as ISO 8601) of a new temporary credential."""
        now = time.time()
        key = "ASIA" + secrets.token_hex(8).upper()
        secret, token = secrets.token_urlsafe(30), "FwoG" + secrets.token_urlsafe(60)
        with self._lock:
            self._creds[key] = Credential(secret, token, expires_at=now + self.lifetime_s + self.grace_s)
            self.issued += 1
        expiration = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                   time.gmtime(now + self.lifetime_s + SDK_REFRESH_MARGIN_S))
        return key, secret, token, expiration

    def lookup(self, access_key: str) -> Credential | None:
        with self._lock:
            return self._creds.get(access_key)


class _Server:
    """A stdlib HTTP server on 127.0.0.1 on its own thread."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self, authority: CredentialAuthority) -> None:
        self.authority = authority
        self.calls = 0
        outer = self

        class Handler(self.handler):  # type: ignore[name-defined]
            server_state = outer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _Quiet(BaseHTTPRequestHandler):
    server_state: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _StsHandler(_Quiet):
    def do_POST(self) -> None:  # noqa: N802
        state = self.server_state
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        if form.get("Action") != ["AssumeRoleWithWebIdentity"] or form.get("WebIdentityToken") != [state.web_token] \
                or form.get("RoleArn") != [state.role_arn]:
            self._send(403, b"<ErrorResponse><Error><Code>AccessDenied</Code><Message>bad web identity"
                            b"</Message></Error></ErrorResponse>", "text/xml")
            return
        state.calls += 1
        key, secret, token, expiration = state.authority.issue()
        body = f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{key}</AccessKeyId>
<SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{token}</SessionToken>
<Expiration>{expiration}</Expiration></Credentials>
<SubjectFromWebIdentityToken>system:serviceaccount:logging:shipper</SubjectFromWebIdentityToken>
<AssumedRoleUser><Arn>{state.role_arn}/shipper</Arn><AssumedRoleId>AROA:shipper</AssumedRoleId></AssumedRoleUser>
</AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"""
        self._send(200, body.encode(), "text/xml")


class FakeSts(_Server):
    """AssumeRoleWithWebIdentity for `role_arn` with the token `web_token` (what the token file holds)."""

    handler = _StsHandler

    def __init__(self, authority: CredentialAuthority, role_arn: str, web_token: str) -> None:
        self.role_arn, self.web_token = role_arn, web_token
        super().__init__(authority)


class _ImdsHandler(_Quiet):
    ROLE = "shipper-node-role"

    def do_PUT(self) -> None:  # noqa: N802
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._send(400, b"", "text/plain")
            return
        self._send(200, self.server_state.imds_token.encode(), "text/plain")

    def do_GET(self) -> None:  # noqa: N802
        state = self.server_state
        if self.headers.get("X-aws-ec2-metadata-token") != state.imds_token:
            self._send(401, b"", "text/plain")          # IMDSv2 only: no token, no answer
            return
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base:
            self._send(200, self.ROLE.encode(), "text/plain")
        elif self.path == base + self.ROLE:
            state.calls += 1
            key, secret, token, expiration = state.authority.issue()
            body = {"Code": "Success", "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "Type": "AWS-HMAC", "AccessKeyId": key, "SecretAccessKey": secret, "Token": token,
                    "Expiration": expiration}
            self._send(200, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b"", "text/plain")


class _EcsHandler(_Quiet):
    def do_GET(self) -> None:  # noqa: N802
        state = self.server_state
        if self.path != "/v2/credentials/shipper" or self.headers.get("Authorization") != state.auth_token:
            self._send(403, b'{"code":"AccessDenied"}', "application/json")
            return
        state.calls += 1
        key, secret, token, expiration = state.authority.issue()
        body = {"AccessKeyId": key, "SecretAccessKey": secret, "Token": token, "Expiration": expiration,
                "RoleArn": "arn:aws:iam::123456789012:role/shipper-task"}
        self._send(200, json.dumps(body).encode(), "application/json")


class FakeEcs(_Server):
    """The ECS/EKS Pod Identity container credentials endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI
    `url` + /v2/credentials/shipper, with AWS_CONTAINER_AUTHORIZATION_TOKEN `auth_token`)."""

    handler = _EcsHandler

    def __init__(self, authority: CredentialAuthority) -> None:
        self.auth_token = secrets.token_urlsafe(20)
        super().__init__(authority)


class FakeImds(_Server):
    """EC2 instance metadata, IMDSv2 (a PUT for a session token first), one role's credentials."""

    handler = _ImdsHandler

    def __init__(self, authority: CredentialAuthority) -> None:
        self.imds_token = secrets.token_urlsafe(20)
        super().__init__(authority)
