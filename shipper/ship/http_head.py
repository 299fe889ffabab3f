"""An HTTP/1.x answer's head (status line and headers) parsed, or a ProtocolError: pure, shared
by the keep-alive client (http1.py) and the proxy's CONNECT tunnel (proxy.py), which both read
answers off sockets of their own."""

from __future__ import annotations


class ProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.x that can be read."""


def parse_head(head: bytes) -> tuple[int, bool, dict[str, str]]:
    """(status, HTTP/1.1?, headers) of a response head without its final CRLFCRLF. Raises ProtocolError."""
    lines = head.split(b"\r\n")
    status_line = lines[0]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line in the answer: {line[:80]!r}")
        headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
    return int(parts[1]), parts[0] == b"HTTP/1.1", headers
