"""Certificates for the tests, made by the `openssl` CLI: a CA and server leaves signed by it."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) of a self-signed CA (P-256, two days)."""
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def make_leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    """(certificate, key) signed by `ca`, with the X.509 extensions `ext` (an openssl extfile's text)."""
    key, csr, crt, extfile = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    extfile.write_text(ext)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(crt), "-days", "2", "-extfile", str(extfile))
    return crt, key


def server_context(d: Path, ca: tuple[Path, Path], dns_name: str) -> tuple[ssl.SSLContext, list[str | None]]:
    """An https server's context whose certificate names only `dns_name` (signed by `ca`), and the
    list of the SNI names clients sent it (appended as they connect)."""
    crt, key = make_leaf(d, f"server-{dns_name}", ca,
                         f"subjectAltName=DNS:{dns_name}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(crt), str(key))
    seen: list[str | None] = []

    def remember(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        seen.append(name)

    ctx.sni_callback = remember
    return ctx, seen
