"""docs/pino.md is true: its pino-http line, built by DocBuilder with `ecs: add` and with `ecs:
replace`, gives exactly the two documents shown, and the line is one the real pino-http wrote
(tests/fixtures/pino/lines.ndjson)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from shipper.config import EcsMode, InputConfig
from shipper.parse.document import DocBuilder

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "pino.md").read_text()


def test_the_pages_documents_are_what_the_code_builds() -> None:
    line = re.search(r"```text\n(.*?)\n```", PAGE, re.DOTALL)
    assert line is not None
    data = line.group(1).encode()
    assert data in (ROOT / "tests" / "fixtures" / "pino" / "lines.ndjson").read_bytes().splitlines()
    offset = int(re.search(r"\(at offset (\d+)\)", PAGE).group(1))  # type: ignore[union-attr]
    shown = [orjson.loads(m) for m in re.findall(r"```json\n(.*?)\n```", PAGE, re.DOTALL)]
    assert len(shown) == 2
    modes: tuple[EcsMode, ...] = ("add", "replace")
    for mode, want in zip(modes, shown, strict=True):
        out: list[bytes] = []
        DocBuilder(InputConfig(paths=("/var/log/checkout/*.log",), ecs=mode), "logs-%Y.%m.%d", "node-7").build(
            "a1b2c3d4e5f6", "/var/log/checkout/app.log", [(offset, offset + len(data) + 1, data, 0)], 0.0, out)
        assert orjson.loads(out[0].split(b"\n")[1]) == want, mode
