"""Pure: container runtimes' log lines (Docker json-file, CRI) decoded into records (stream, partial
or not, the runtime's time, text, attrs), and the runtime's time as epoch seconds. No I/O and no
clock; container_join.py joins the partial records, container_doc.py makes their documents."""
from __future__ import annotations

import calendar
from datetime import datetime
from typing import Any, Literal

import orjson

from shipper.model import ContainerEvent

__all__ = ["ContainerEvent", "ContainerFormat", "Record", "decode_auto", "decode_cri", "decode_docker",
           "is_container_record", "looks_like_container", "parse_rfc3339", "physical_max_line_bytes"]

ContainerFormat = Literal["docker", "cri", "auto"]

# One physical record, decoded: (stream, is_partial, runtime time, text, docker attrs).
# The time is the runtime's RFC 3339 text as written (`parse_rfc3339` gives epoch seconds; it is
# parsed only for a document whose line has no time of its own, most pino lines have one).
# `text` is the record's bytes without the newline that ends a complete Docker record.
Record = tuple[str, bool, str, bytes, "dict[str, Any] | None"]


STREAMS = ("stdout", "stderr")
DOCKER_PIECE_BYTES = 16 * 1024        # dockerd's copier cuts a line into pieces of this many raw bytes
DOCKER_HEAD = b'{"log":'             # dockerd writes `log` first (jsonlog.JSONLogs.MarshalJSONBuf)

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def physical_max_line_bytes(fmt: str, max_line_bytes: int) -> int:
    """The cap the line splitter should use for an input of this format.

    A record's envelope (the JSON around `log`, the CRI header) must survive the splitter's cut,
    so the joiner can still decode a piece and cut the joined text at `max_line_bytes` itself.
    A Docker piece is 16 KiB of raw bytes, up to 6x that once escaped (`\\u0000`); a CRI piece is
    the text after a header of at most ~50 bytes, and its text may be cut (the tag comes first).
    """
    if fmt == "cri":
        return max_line_bytes + 256
    if fmt in ("docker", "auto"):
        return max(max_line_bytes + 256, 6 * DOCKER_PIECE_BYTES + 1024)
    return max_line_bytes


# ----------------------------------------------------------------------------- time

_SECONDS: dict[str, int] = {}
_POW10: list[int] = [10 ** i for i in range(40)]


def parse_rfc3339(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 time as the runtimes write it (`2026-12-01T10:00:00.123456789Z`,
    Go's RFC3339Nano: 0-9 fraction digits; CRI-O: `+00:00`); None for anything else (also "")."""
    sec = _SECONDS.get(text[:19])
    if sec is not None and text[-1] == "Z":
        # the usual case: a second seen before (its 19 characters are checked), UTC
        rest = text[19:-1]
        if not rest:
            return float(sec)
        digits = rest[1:]
        if rest[0] == "." and digits.isdigit() and digits.isascii():
            return sec + int(digits) / _POW10[len(digits)]
    n = len(text)
    if n < 20 or text[4] != "-" or text[7] != "-" or text[10] not in "Tt" or text[13] != ":" or text[16] != ":":
        return None
    last = text[-1]
    if last == "Z" or last == "z":
        zone_s = 0
        body = n - 1
    elif n >= 25 and text[-3] == ":" and text[-6] in "+-":
        hh, mm = text[-5:-3], text[-2:]
        if not (hh.isdigit() and mm.isdigit() and hh.isascii() and mm.isascii()):
            return None
        zone_s = int(hh) * 3600 + int(mm) * 60
        if text[-6] == "-":
            zone_s = -zone_s
        body = n - 6
    else:
        return None
    frac = 0.0
    if body != 19:
        digits = text[20:body]
        if text[19] != "." or not digits or not digits.isdigit() or not digits.isascii():
            return None
        if len(digits) >= len(_POW10):
            return None
        frac = int(digits) / _POW10[len(digits)]
    head = text[:19]
    sec = _SECONDS.get(head)
    if sec is None:
        if not (head[:4] + head[5:7] + head[8:10] + head[11:13] + head[14:16] + head[17:19]).isdigit() \
                or not head.isascii():
            return None
        try:
            sec = calendar.timegm(datetime.fromisoformat(head).timetuple())
        except ValueError:
            return None
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        _SECONDS[head] = sec
    return sec - zone_s + frac


# ----------------------------------------------------------------------------- decoding

def decode_docker(data: bytes) -> Record | None:
    """One line of Docker's json-file driver, or None when it is not one.

    A record is a JSON object with `log` (text), `stream` (stdout/stderr) and `time` (text; an
    unparseable one gives the read time later); `attrs` (the `--log-opt labels/env/tag` values) is
    kept when it is an object. Bytes that are not UTF-8 (dockerd itself writes U+FFFD for them)
    are replaced, never fatal.
    """
    try:
        d = _loads(data)
    except _JSONDecodeError:
        try:
            d = _loads(data.decode("utf-8", "replace"))
        except _JSONDecodeError:
            return None
    if type(d) is not dict:
        return None
    log = d.get("log")
    stream = d.get("stream")
    tm = d.get("time")
    if type(log) is not str or type(tm) is not str or (stream != "stdout" and stream != "stderr"):
        return None
    # orjson never gives lone surrogates (it rejects them), so a plain encode is safe
    if log[-1:] == "\n":
        text = log[:-1].encode()
        partial = False
    else:
        text = log.encode()
        partial = True
    attrs = d.get("attrs")
    return stream, partial, tm, text, attrs if type(attrs) is dict and attrs else None


def decode_cri(data: bytes, *, strict: bool = False) -> Record | None:
    """One line of the CRI log format (containerd, CRI-O): `<RFC 3339 time> <stream> <tags> <text>`,
    or None when it is not one.

    Like the kubelet, the first `:`-separated tag `P` means partial and any other tag complete
    (forward compatible); `strict` (format auto) accepts only `P` and `F`. The text is raw bytes.
    """
    sp = data.find(b" ", 19, 40)
    if sp < 0:
        return None
    s_end = sp + 7
    stream_b = data[sp + 1:s_end]
    if stream_b == b"stdout":
        stream = "stdout"
    elif stream_b == b"stderr":
        stream = "stderr"
    else:
        return None
    if data[s_end:s_end + 1] != b" ":
        return None
    tag_end = data.find(b" ", s_end + 1)
    if tag_end < 0 or tag_end == s_end + 1:
        return None
    tag = data[s_end + 1:tag_end]
    first = tag.split(b":", 1)[0] if b":" in tag else tag
    if strict and first != b"F" and first != b"P":
        return None
    # the time's shape only (`YYYY-MM-DDTHH:MM:SS...`); it is parsed when a document needs it
    if data[4] != 45 or data[7] != 45 or data[10] != 84 or data[13] != 58 or data[16] != 58 \
            or not data[:4].isdigit():
        return None
    return stream, first == b"P", data[:sp].decode("latin-1"), data[tag_end + 1:], None


def looks_like_container(data: bytes) -> bool:
    """Cheap pre-check for format auto: could this line be a Docker or CRI record?"""
    return data[:7] == DOCKER_HEAD or (data[4:5] == b"-" and data[10:11] == b"T" and data[:1].isdigit())


def is_container_record(data: bytes) -> bool:
    """Is this line a Docker json-file or CRI record (as format auto recognises them)?"""
    return looks_like_container(data) and decode_auto(data) is not None


def decode_auto(data: bytes) -> Record | None:
    if data[:7] == DOCKER_HEAD:
        return decode_docker(data)
    if data[4:5] == b"-" and data[10:11] == b"T" and data[:1].isdigit():
        return decode_cri(data, strict=True)
    return None
