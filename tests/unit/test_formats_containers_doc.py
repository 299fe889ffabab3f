"""The examples of docs/containers.md are true: each section's lines, read by the
splitter and the container joiner and built by DocBuilder, give exactly the documents shown."""

from __future__ import annotations

import calendar
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from shipper.config import InputConfig
from shipper.parse.container import ContainerEvent, physical_max_line_bytes
from shipper.parse.container_join import ContainerJoiner
from shipper.parse.document import DocBuilder
from shipper.tail.lines import LineSplitter

DOC = Path(__file__).resolve().parents[2] / "docs" / "containers.md"
READ_AT = calendar.timegm((2026, 11, 30, 12, 0, 0)) + 0.25      # "read at 2026-11-30T12:00:00.250Z"


def sections() -> list[tuple[str, str, bytes, list[Any]]]:
    out = []
    for sec in re.split(r"^##+ ", DOC.read_text(), flags=re.MULTILINE)[1:]:
        fmt = re.search(r"^    format: (\w+)$", sec, re.MULTILINE)
        path = re.search(r"^Lines in `([^`]+)`:", sec, re.MULTILINE)
        if fmt is None or path is None:
            continue
        text = re.search(r"```text\n(.*?)\n```", sec, re.DOTALL)
        assert text is not None
        docs = [orjson.loads(m) for m in re.findall(r"```json\n(.*?)\n```", sec, re.DOTALL)]
        out.append((fmt.group(1), path.group(1), text.group(1).encode() + b"\n", docs))
    return out


def test_the_doc_has_both_formats() -> None:
    assert [s[0] for s in sections()] == ["docker", "cri"]


@pytest.mark.parametrize("fmt, path, blob, want", sections(), ids=lambda v: v if isinstance(v, str) and len(v) < 8 else "")
def test_documents_are_what_the_code_builds(fmt: Any, path: str, blob: bytes, want: list[Any]) -> None:
    sp = LineSplitter(0, physical_max_line_bytes(fmt, 1024 * 1024))
    j = ContainerJoiner(fmt, 1024 * 1024)
    evs: list[ContainerEvent] = []
    for ln in sp.feed(blob):
        evs += j.feed(ln, 0.0)
    evs += j.flush()
    out: list[bytes] = []
    DocBuilder(InputConfig(paths=(path,), format=fmt), "logs-%Y.%m.%d", "node-1").build_container(
        "x", path, evs, READ_AT, out)
    assert [orjson.loads(p.split(b"\n")[1]) for p in out] == want
