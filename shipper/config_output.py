"""Sub-sections of `output.elasticsearch` and their dataclasses: `tls` (client certificate,
CA pinning), `data_stream` (Elastic's `<type>-<dataset>-<namespace>` naming) and `aws_sigv4`
(Amazon OpenSearch). Read by `shipper.config`'s `_output`, which re-exports the dataclasses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from shipper.config_values import Lines, Section, parse_fingerprint
from shipper.errors import ConfigError

__all__ = ["AwsSigV4Config", "DataStreamConfig", "IndexTemplateMode", "TLSConfig", "read_aws_sigv4",
           "read_data_stream", "read_tls"]


@dataclass(frozen=True, slots=True)
class TLSConfig:
    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None          # client certificate (PEM); may hold the key too
    key_file: str | None = None           # its private key (PEM)
    ca_fingerprint: str | None = None     # SHA-256 of a CA certificate in the server's chain: 64 hex digits, lower case


IndexTemplateMode = Literal["auto", "off"]


@dataclass(frozen=True, slots=True)
class DataStreamConfig:
    """`output.elasticsearch.data_stream`: documents go with `create` to `<type>-<dataset>-<namespace>`."""

    type: str = "logs"
    dataset: str = "generic"
    namespace: str = "default"

    @property
    def name(self) -> str:
        return f"{self.type}-{self.dataset}-{self.namespace}"


AwsService = Literal["es", "aoss"]


@dataclass(frozen=True, slots=True)
class AwsSigV4Config:
    """`output.elasticsearch.aws_sigv4`: every request signed with AWS Signature Version 4."""

    region: str
    service: AwsService = "es"        # es: Amazon OpenSearch Service; aoss: OpenSearch Serverless


# The defaults, as the dataclasses give them: the readers take every default from these.
_TLS_DEFAULTS = TLSConfig()
_DATA_STREAM_DEFAULTS = DataStreamConfig()
_DS_PART_RE = re.compile(r"[a-z0-9_.]+")   # Elastic's naming scheme: lower case, no `-` inside a part


def read_tls(t: Section, ca: str | None, lines: Lines) -> TLSConfig:
    verify = t.boolean("verify", _TLS_DEFAULTS.verify)
    cert = t.string("cert_file", None)
    key = t.string("key_file", None)
    for name, path in (("cert_file", cert), ("key_file", key)):
        if path and not os.path.exists(path):
            raise lines.error(t.key(name), f"file not found: {path}")
    if key and not cert:
        raise lines.error(t.key("key_file"), "is set but tls.cert_file is not")
    if cert:
        import ssl
        try:
            ssl.create_default_context().load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as e:
            raise lines.error(t.key("cert_file" if key is None else "key_file"),
                              f"cannot load the client certificate and key: {e}") from None
    fp = t.string("ca_fingerprint", None)
    if fp:
        try:
            fp = parse_fingerprint(fp, t.key("ca_fingerprint"))
        except ConfigError as e:
            raise lines.error(e.key, e.message) from None
        if not verify:
            raise lines.error(t.key("ca_fingerprint"), "pins a CA, which needs tls.verify: true")
    return TLSConfig(verify=verify, ca_file=ca, cert_file=cert, key_file=key, ca_fingerprint=fp or None)


def read_data_stream(es: Section, lines: Lines) -> DataStreamConfig | None:
    if es.raw("data_stream") is None:
        return None
    d = Section(es.raw("data_stream"), es.key("data_stream"), lines)
    ds = DataStreamConfig(type=d.string("type", _DATA_STREAM_DEFAULTS.type),
                          dataset=d.string("dataset", _DATA_STREAM_DEFAULTS.dataset),
                          namespace=d.string("namespace", _DATA_STREAM_DEFAULTS.namespace))
    for part, v in (("type", ds.type), ("dataset", ds.dataset), ("namespace", ds.namespace)):
        if not _DS_PART_RE.fullmatch(v) or v.startswith((".", "_")):
            raise lines.error(d.key(part), f"expected lower-case letters, digits, `_` or `.` (no `-`), got {v!r}")
    if len(ds.name.encode()) > 100:
        raise lines.error(d.key("dataset"), "the data stream name would be longer than 100 bytes")
    d.finish()
    return ds


_REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")


def read_aws_sigv4(es: Section, env: Mapping[str, str], lines: Lines) -> AwsSigV4Config | None:
    """The `aws_sigv4` section; the region may come from AWS_REGION / AWS_DEFAULT_REGION. It needs
    botocore (`pip install 'shipper[aws]'`) and excludes the other ways to authenticate."""
    raw = es.raw("aws_sigv4")
    if raw is None:
        return None
    key = es.key("aws_sigv4")
    a = Section(raw, key, lines)
    region = a.string("region", None) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise lines.error(a.key("region"), "is required (or set AWS_REGION): the region of the domain or "
                                           "collection, e.g. eu-west-1")
    if not _REGION_RE.fullmatch(region):
        raise lines.error(a.key("region"), f"is not an AWS region name: {region!r}")
    service: AwsService = a.string("service", "es", ("es", "aoss"))
    a.finish()
    for other in ("username", "password", "api_key"):
        if es.raw(other) is not None:
            raise lines.error(key, f"signs every request with AWS credentials: not together with {other}")
    try:
        import botocore.session  # noqa: F401  (the credential chain; an optional extra)
    except ImportError:
        raise lines.error(key, "needs botocore, which is not installed: pip install 'shipper[aws]'") from None
    return AwsSigV4Config(region=region, service=service)
