"""`shipper status` as text: header block (daemon, output, rates, queue), one row per file."""

from __future__ import annotations

from typing import Any

from shipper.commands.status import bar, human_bytes, human_duration, render

NOW = 1_800_000_000.0


def running_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "daemon": "running", "running": True, "mode": "daemon", "pid": 4242, "started": NOW - 3725,
        "updated": NOW,
        "files": [
            {"path": "/var/log/app/app.log", "inode": 1048577, "incarnation": "a1", "offset": 70 * 1024 * 1024,
             "size": 100 * 1024 * 1024, "lag_bytes": 30 * 1024 * 1024, "state": "active",
             "rate_bytes_per_s": 1024 * 1024, "eta_s": 30.0},
            {"path": "/var/log/app/app.log.1", "inode": 1048500, "incarnation": "a0", "offset": 2048,
             "size": 2048, "lag_bytes": 0, "state": "renamed", "rate_bytes_per_s": None, "eta_s": 0.0},
        ],
        "queue": {"events": 12400, "bytes": 3 * 1024 * 1024 + 200 * 1024},
        "dead_letter": 0,
        "output": {"up": True, "last_error": None, "down_since": None, "hosts": ["http://127.0.0.1:9200"]},
        "rates": {"events_in_per_s": 4120.4, "events_out_per_s": 3980.0, "bytes_out_per_s": 1024 * 1024},
        "lag_bytes": 30 * 1024 * 1024, "eta_s": 30.0,
    }
    doc.update(over)
    return doc


def test_running_table_has_progress_lag_eta_rates_and_queue() -> None:
    text = render(running_doc(), "/var/lib/shipper", NOW)
    lines = text.splitlines()
    assert lines[0] == "shipper: running (pid 4242, up 1h02m)   state_dir: /var/lib/shipper"
    assert "output:  up   http://127.0.0.1:9200" in text
    assert "rates:   in 4,120 events/s   out 3,980 events/s   shipped 1.0 MiB/s" in text
    assert "queue:   12,400 events (3.2 MiB)   dead letters: 0" in text
    assert "backlog: 30.0 MiB not yet shipped   ETA 30s" in text
    header = next(i for i, ln in enumerate(lines) if ln.startswith("FILE"))
    row = lines[header + 1]
    assert row.startswith("/var/log/app/app.log ")
    assert "1048577" in row and "[##############------]  70.0%" in row
    assert "70.0 MiB / 100.0 MiB" in row and "30.0 MiB" in row and row.endswith("30s")
    assert lines[header + 2].startswith("/var/log/app/app.log.1 (renamed)")
    assert "[####################] 100.0%" in lines[header + 2]
    # columns line up: every row starts each column at the header's offset
    col = lines[header].index("PROGRESS")
    assert lines[header + 1][col] == "[" and lines[header + 2][col] == "["


def test_backing_off_shows_since_when_and_last_error() -> None:
    doc = running_doc(output={"up": False, "last_error": "HTTP 503 from http://127.0.0.1:9200: unavailable",
                              "down_since": NOW - 192, "hosts": ["http://127.0.0.1:9200"]})
    text = render(doc, "/s", NOW)
    assert "output:  BACKING OFF since " in text and "(3m12s ago)" in text
    assert "last error: HTTP 503 from http://127.0.0.1:9200: unavailable" in text


def test_stopped_shows_last_known_state_without_rates_or_eta() -> None:
    doc = running_doc(running=False, daemon="stopped", pid=None, updated=NOW - 7200,
                      rates={"events_in_per_s": None, "events_out_per_s": None, "bytes_out_per_s": None},
                      dead_letter=3)
    text = render(doc, "/s", NOW)
    assert text.startswith("shipper: stopped   state_dir: /s   last seen: ")
    assert "(2h00m ago)" in text
    assert "output:  last known up" in text
    assert "rates:" not in text
    assert "dead letters: 3   (see: shipper dlq list)" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("/var/log/app/app.log "))
    assert row.endswith("-")        # no ETA while stopped


def test_pipe_and_empty() -> None:
    doc = running_doc(mode="pipe", files=[], lag_bytes=0)
    text = render(doc, "/s", NOW)
    assert text.startswith("shipper pipe: running")
    assert "files:   none tracked yet" in text
    stdin = running_doc(mode="pipe", files=[{"path": "-", "inode": None, "incarnation": "x", "offset": 10,
                                             "size": 40, "lag_bytes": 30, "state": "reading",
                                             "rate_bytes_per_s": None, "eta_s": None}])
    row = next(ln for ln in render(stdin, "/s", NOW).splitlines() if ln.startswith("- "))
    assert "[#####---------------]  25.0%" in row and row.endswith("-")


def test_units() -> None:
    assert human_bytes(None) == "-"
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(5 * 1024**3) == "5.0 GiB"
    assert human_duration(None) == "-"
    assert human_duration(59.4) == "59s"
    assert human_duration(61) == "1m01s"
    assert human_duration(3 * 3600 + 5 * 60) == "3h05m"
    assert human_duration(2 * 86400 + 3600) == "2d01h"
    assert bar(0, 0) == "[####################] 100.0%"       # an empty file is fully shipped
    assert bar(5, 10, width=10) == "[#####-----]  50.0%"
    assert bar(20, 10, width=10) == "[##########] 100.0%"    # size shrank under us: clamp, never overflow
    assert bar(3, None, width=4) == "[????]      "
