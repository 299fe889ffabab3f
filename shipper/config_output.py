"""Two sub-sections of `output.elasticsearch` and their dataclasses: `tls` (client certificate,
CA pinning) and `data_stream` (Elastic's `<type>-<dataset>-<namespace>` naming). Read by
`shipper.config`'s `_output`, which re-exports `TLSConfig` and `DataStreamConfig`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from shipper.config_values import Lines, Section, parse_fingerprint
from shipper.errors import ConfigError

__all__ = ["DataStreamConfig", "IndexTemplateMode", "TLSConfig", "read_data_stream", "read_tls"]


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
    for part in ("type", "dataset", "namespace"):
        v = getattr(ds, part)
        if not _DS_PART_RE.fullmatch(v) or v.startswith((".", "_")):
            raise lines.error(d.key(part), f"expected lower-case letters, digits, `_` or `.` (no `-`), got {v!r}")
    if len(ds.name.encode()) > 100:
        raise lines.error(d.key("dataset"), "the data stream name would be longer than 100 bytes")
    d.finish()
    return ds
