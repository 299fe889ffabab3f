"""status.json is rewritten at once when what it says changes, and only every STATUS_SAME_EVERY_S
when only drifting figures moved (rates and ETAs decaying after a burst, the disk's free bytes,
the seconds an output has been down): an idle daemon must not create and rename a file every 2 s."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shipper.service import without_drift


def _doc() -> dict[str, Any]:
    return {
        "daemon": "running", "running": True, "mode": "daemon", "pid": 3979, "version": "0.1.0",
        "updated": 1796233375.08, "started": 1796233291.12,
        "files": [{"path": "/var/log/app.log", "inode": 2146524, "incarnation": "3f7c0e0a8192", "offset": 24,
                   "queued_offset": 24, "size": 24, "lag_bytes": 0, "state": "active",
                   "rate_bytes_per_s": 12.5, "eta_s": 0.0}],
        "journald": [], "queue": {"events": 0, "bytes": 0}, "dead_letter": 0,
        "output": {"up": True, "last_error": None, "down_since": None, "down_for_s": None,
                   "hosts": ["http://127.0.0.1:9200"]},
        "rates": {"events_in_per_s": 0.4, "events_out_per_s": 0.4, "bytes_out_per_s": 12.5},
        "lag_bytes": 0, "eta_s": 0.0, "read_total": 1, "shipped_total": 1, "bytes_at_risk": 0,
        "state_dir": {"path": "/var/lib/shipper", "full": False, "free_bytes": 84856139776,
                      "reserve_bytes": 33554432, "quarantined": 0},
    }


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *keys, last = path.split(".")
    node: Any = out
    for k in keys:
        node = node[int(k)] if k.isdigit() else node[k]
    node[last] = value
    return out


@pytest.mark.parametrize(("path", "value"), [
    ("updated", 1796233399.0), ("rates.events_in_per_s", 0.1), ("rates.bytes_out_per_s", 0.0), ("eta_s", 3.0),
    ("files.0.rate_bytes_per_s", 0.0), ("files.0.eta_s", None), ("state_dir.free_bytes", 84856000000),
    ("output.down_for_s", 14.0),
])
def test_drifting_figures_alone_are_not_a_change(path: str, value: Any) -> None:
    doc = _doc()
    assert without_drift(_set(doc, path, value)) == without_drift(doc)


@pytest.mark.parametrize(("path", "value"), [
    ("files.0.offset", 400), ("files.0.state", "rotated"), ("queue.events", 3), ("dead_letter", 1),
    ("output.up", False), ("output.last_error", "HTTP 503"), ("state_dir.full", True), ("shipped_total", 2),
    ("running", False),
])
def test_what_the_status_says_is_a_change(path: str, value: Any) -> None:
    doc = _doc()
    assert without_drift(_set(doc, path, value)) != without_drift(doc)


def test_material_leaves_the_document_itself_whole() -> None:
    doc = _doc()
    before = copy.deepcopy(doc)
    without_drift(doc)
    assert doc == before


def test_status_file_reader_takes_a_newer_mtime_as_updated(tmp_path: Any) -> None:
    """The daemon vouches for an unchanged status.json by moving its mtime (service.vouch_status)."""
    import os

    import orjson

    from shipper.commands.status import _read_status_file
    from shipper.service import STATUS_FILE, vouch_status
    doc = _doc()
    path = tmp_path / STATUS_FILE
    path.write_bytes(orjson.dumps(doc))
    os.utime(path, (doc["updated"] + 30, doc["updated"] + 30))
    got = _read_status_file(str(tmp_path))
    assert got is not None and got["updated"] == pytest.approx(doc["updated"] + 30)
    os.utime(path, (doc["updated"] - 30, doc["updated"] - 30))     # older than the doc: the doc's own time
    got = _read_status_file(str(tmp_path))
    assert got is not None and got["updated"] == doc["updated"]
    assert vouch_status(str(tmp_path))
    assert abs(os.path.getmtime(path) - __import__("time").time()) < 5
    assert not vouch_status(str(tmp_path / "nowhere"))
