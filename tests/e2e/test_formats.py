"""One end-to-end test per format: real lines in real files, the daemon as a subprocess, documents
read back from osmem-server with their fields and types checked.

One daemon ships every input of this module (each format to its own index), so the whole module
costs one start; each test then checks one format's documents.
"""

from __future__ import annotations

import signal
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import promptness
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.promptness import Timeline
from tests.support.proxy import RecordingProxy
from tests.support.wait import wait_until

NGINX = [
    '203.0.113.7 - - [10/Oct/2026:13:55:36 +0000] "GET /api/items?id=5 HTTP/1.1" 200 612 "https://example.com/" "Mozilla/5.0 (X11; Linux x86_64)"',
    '2001:db8::1 - alice [10/Oct/2026:13:55:37 +0000] "POST /login HTTP/2.0" 302 - "-" "curl/8.5.0"',
]
APACHE = [
    '198.51.100.23 - bob [10/Oct/2026:13:55:36 -0700] "GET /index.html HTTP/1.0" 404 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)"',
]
SYSLOG = [
    "<34>Oct 11 22:14:15 mymachine su[1234]: 'su root' failed for lonvick on /dev/pts/8",
    '<165>1 2026-10-11T22:14:15.003Z mymachine.example.com evntslog 8710 ID47 [exampleSDID@32473 iut="3" eventSource="Application"] An application event log entry',
]
JAVA = [
    "2026-11-30 12:00:00,001 ERROR [main] com.example.App - request failed",
    "java.lang.IllegalStateException: boom",
    "\tat com.example.App.handle(App.java:42)",
    "\tat com.example.App.main(App.java:10)",
    "Caused by: java.io.IOException: disk gone",
    "\t... 12 more",
    "2026-11-30 12:00:01,000 INFO [main] com.example.App - recovered",
]
PINO = [
    '{"level":30,"time":1796040000123,"pid":81,"hostname":"web-01","msg":"listening","port":8080}',
    '{"level":50,"time":"2026-11-30T12:00:01.5Z","name":"bunyan-app","msg":"bunyan error","v":0}',
    '{"level":40,"time":1796040000999,"msg":"has secret card 4111-1111-1111-1111","token":"drop-me","user":"x"}',
    '{"oops": ',
    "plain text in a json input",
]
TEXT = ["a plain text line", "", "another \u00e9 line"]
CUSTOM = ["ts=2026-11-30T08:00:00+01:00 lvl=warn user=42 msg=disk almost full"]


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\n".join(lines) + "\n").encode())


@pytest.fixture(scope="module")
def shipped(osmem_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ES]:
    """Every format's documents, each arrived within the promptness bound of the start (its own
    timeline and recording proxy: a module fixture outlives the per-test ones)."""
    clone = osmem_server.clone()
    tl = Timeline()
    rec = RecordingProxy(clone.url, tl).start()
    tmp = tmp_path_factory.mktemp("formats")
    files = {
        "nginx": NGINX, "apache": APACHE, "syslog": SYSLOG, "java": JAVA,
        "pino": PINO, "text": TEXT, "custom": CUSTOM,
    }
    for name, lines in files.items():
        _write(tmp / name / f"{name}.log", lines)
    written_at = tl.now()
    inputs: list[dict[str, Any]] = [
        {"paths": [str(tmp / "nginx/*.log")], "format": "regex", "pattern": "nginx", "index": "f-nginx"},
        {"paths": [str(tmp / "apache/*.log")], "format": "regex", "pattern": "apache", "index": "f-apache"},
        {"paths": [str(tmp / "syslog/*.log")], "format": "regex", "pattern": "syslog", "index": "f-syslog",
         "timezone": "UTC"},
        {"paths": [str(tmp / "java/*.log")], "format": "text", "index": "f-java",
         "multiline": {"start": r"^\d{4}-\d{2}-\d{2} ", "timeout": "300ms"}},
        {"paths": [str(tmp / "pino/*.log")], "format": "json", "index": "f-pino-{log.level|none}",
         "fields": {"service": "api"}, "drop_fields": ["token"], "rename_fields": {"user": "user.id"},
         "mask": {r"\d{4}-\d{4}-\d{4}-\d{4}": "[card]"}},
        {"paths": [str(tmp / "text/*.log")], "format": "text", "index": "f-text"},
        {"paths": [str(tmp / "custom/*.log")], "format": "regex", "index": "f-custom",
         "pattern": r"^ts=(?P<timestamp>\S+) lvl=(?P<log__level>\w+) user=(?P<user__id>\d+) msg=(?P<message>.*)$"},
    ]
    cfg = write_config(tmp, es_url=rec.url, paths=[str(tmp / "none/*.log")])
    import yaml

    data = yaml.safe_load(cfg.read_text())
    data["inputs"] = [{**i, "scan_interval": "500ms"} for i in inputs]
    cfg.write_text(yaml.safe_dump(data))
    d = Daemon(cfg)
    es = ES(rec.url, timeline=tl)
    try:
        with promptness.active(tl):
            d.start()
            d.wait_ready()
            expected = len(NGINX) + len(APACHE) + len(SYSLOG) + 2 + len(PINO) + 2 + len(CUSTOM)
            wait_until(lambda: es.count() >= expected, f"{expected} documents across the format indices", timeout_s=30)
            es.assert_prompt(es.all_docs(), key_fn=lambda h: h["_id"], written=lambda h: written_at)
            assert d.terminate() == 0
        yield es
    finally:
        if d.alive:
            d.kill9()
        rec.stop()
        clone.close()


def _docs(es: ES, index: str) -> list[dict[str, Any]]:
    return sorted((h["_source"] for h in es.all_docs(index)), key=lambda s: s["log"]["offset"])


def _common(doc: dict[str, Any], suffix: str) -> None:
    assert doc["host"]["name"]
    assert doc["log"]["file"]["path"].endswith(suffix)
    assert isinstance(doc["log"]["offset"], int)
    assert doc["@timestamp"].endswith("Z") and len(doc["@timestamp"]) == 24


def test_nginx(shipped: ES) -> None:
    a, b = _docs(shipped, "f-nginx")
    _common(a, "nginx.log")
    assert a["source"]["address"] == "203.0.113.7"
    assert a["http"]["request"]["method"] == "GET"
    assert a["url"]["original"] == "/api/items?id=5"
    assert a["http"]["response"]["status_code"] == 200
    assert a["http"]["response"]["body"]["bytes"] == 612
    assert a["http"]["request"]["referrer"] == "https://example.com/"
    assert a["user_agent"]["original"].startswith("Mozilla/5.0")
    assert a["@timestamp"] == "2026-10-10T13:55:36.000Z"
    assert a["message"] == NGINX[0]
    assert b["source"]["address"] == "2001:db8::1"
    assert b["user"]["name"] == "alice"
    assert "bytes" not in b["http"]["response"].get("body", {})


def test_apache(shipped: ES) -> None:
    (a,) = _docs(shipped, "f-apache")
    _common(a, "apache.log")
    assert a["http"]["response"]["status_code"] == 404
    assert a["http"]["response"]["body"]["bytes"] == 2326
    assert a["@timestamp"] == "2026-10-10T20:55:36.000Z"   # -0700 -> UTC
    assert a["user"]["name"] == "bob"


def test_syslog_3164_and_5424(shipped: ES) -> None:
    a, b = _docs(shipped, "f-syslog")
    _common(a, "syslog.log")
    assert a["log"]["syslog"]["priority"] == 34
    assert a["log"]["syslog"]["facility"]["code"] == 4
    assert a["log"]["syslog"]["severity"]["code"] == 2
    assert a["host"]["hostname"] == "mymachine"
    assert a["process"]["name"] == "su" and a["process"]["pid"] == 1234
    assert a["message"] == "'su root' failed for lonvick on /dev/pts/8"
    assert a["@timestamp"].endswith("-10-11T22:14:15.000Z")
    assert b["log"]["syslog"]["priority"] == 165
    assert b["process"]["pid"] == 8710
    assert b["message"] == "An application event log entry"
    assert b["@timestamp"] == "2026-10-11T22:14:15.003Z"


def test_multiline_java_stack_trace_is_one_document(shipped: ES) -> None:
    a, b = _docs(shipped, "f-java")
    _common(a, "java.log")
    assert a["message"] == "\n".join(JAVA[:6])
    assert a["log"]["offset"] == 0
    assert b["message"] == JAVA[6]
    assert b["log"]["offset"] == len("\n".join(JAVA[:6])) + 1


def test_pino_bunyan_filters_and_index_routing(shipped: ES) -> None:
    docs = {d["log"]["offset"]: d for d in (h["_source"] for h in shipped.all_docs("f-pino-*"))}
    by_msg = {d.get("message"): d for d in docs.values()}
    pino = by_msg["listening"]
    _common(pino, "pino.log")
    assert pino["@timestamp"] == "2026-11-30T12:00:00.123Z"
    assert pino["log"]["level"] == "info" and pino["port"] == 8080 and pino["service"] == "api"
    bunyan = by_msg["bunyan error"]
    assert bunyan["@timestamp"] == "2026-11-30T12:00:01.500Z" and bunyan["log"]["level"] == "error"
    masked = by_msg["has secret card [card]"]
    assert "token" not in masked and masked["user"] == {"id": "x"}
    broken = by_msg['{"oops": ']
    assert broken["log"]["flags"] == ["json_parse_failed"]
    assert by_msg["plain text in a json input"]["log"]["flags"] == ["json_parse_failed"]
    indices = {h["_index"] for h in shipped.all_docs("f-pino-*")}
    assert indices == {"f-pino-info", "f-pino-error", "f-pino-warn", "f-pino-none"}


def test_text_lines_and_bad_bytes(shipped: ES) -> None:
    docs = _docs(shipped, "f-text")
    assert [d["message"] for d in docs] == ["a plain text line", "another \u00e9 line"]
    _common(docs[0], "text.log")


def test_user_regex_with_timestamp_and_dotted_groups(shipped: ES) -> None:
    (a,) = _docs(shipped, "f-custom")
    assert a["@timestamp"] == "2026-11-30T07:00:00.000Z"
    assert a["log"]["level"] == "warn"
    assert a["user"]["id"] == "42"
    assert a["message"] == "disk almost full"


def test_multiline_event_survives_kill9_without_split_or_duplicate(tmp_path: Path, es: ES, daemon_factory: Any,
                                                                   timeline: Timeline) -> None:
    """The checkpoint of a held multiline event is its first line: a kill -9 mid-event re-reads it whole."""
    log = tmp_path / "logs" / "py.log"
    head = ["2026-11-30 12:00:00,001 ERROR boom", "Traceback (most recent call last):",
            '  File "app.py", line 3, in <module>']
    _write(log, head)
    cfg = write_config(tmp_path, es_url=es.url, paths=str(log.parent / "*.log"),
                       input_extra={"format": "text", "multiline": {"start": r"^\d{4}-\d{2}-\d{2} ", "timeout": "30s"}})
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: d.status_json()["files"], "the file to be tracked")
    d.kill9()
    with open(log, "a") as f:
        f.write("ValueError: bad\n2026-11-30 12:00:02,000 INFO next\n")
    completed_at = timeline.now()        # the next record's first line completes the traceback
    d.restart()
    wait_until(lambda: es.count() >= 1, "the traceback document")
    d.send(signal.SIGTERM)   # flushes nothing held: the last event stays for the next run
    d.wait_exit()
    docs = _docs(es, "*")
    assert [doc["message"] for doc in docs] == ["\n".join(head + ["ValueError: bad"])]
    assert docs[0]["log"]["offset"] == 0
    es.assert_prompt(es.all_docs(), key_fn=lambda h: h["_id"], written=lambda h: completed_at)


def test_a_late_continuation_after_a_timeout_cut_survives_kill9(tmp_path: Path, es: ES, daemon_factory: Any,
                                                                timeline: Timeline) -> None:
    """A group cut by its 1 s timeout and acknowledged; a continuation line written after the
    timeout; kill -9 before the keeper wrote the checkpoint past the group (at this rate it writes
    acked checkpoints 10 s apart; on 561318f the restart opened the file at offset 0).
    The restart reads the group and the continuation together: they must be cut where the first
    read cut them (joined, they would carry the group's `_id`, get a 409, and the continuation
    would be in no document)."""
    log = tmp_path / "logs" / "app.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp_path, es_url=es.url, paths=str(log.parent / "*.log"),
                       input_extra={"format": "text", "multiline": {"start": r"^\S", "timeout": "1s"}})
    written: dict[Hashable, float] = {}

    def append(event: str) -> None:
        with open(log, "a") as f:
            f.write(event + "\n")
        written[event] = timeline.now()

    d = daemon_factory(cfg)
    d.wait_ready()
    append("W start")
    wait_until(lambda: es.count() >= 1, "the first event")
    append("G start\n  g continued")
    wait_until(lambda: es.count() >= 2, "the group, cut by its timeout")
    append("  late continuation")
    d.restart()                        # kill -9 (within 10 s of that flush), start again
    wait_until(lambda: es.count() >= 3, lambda: f"the late continuation's own document\n{d.tail(20)}")
    append("Z start")                  # a later point: the restart's re-read is done once it is in
    wait_until(lambda: es.count() >= 4, "the last event")
    docs = _docs(es, "*")
    assert sorted(doc["message"] for doc in docs) == sorted(map(str, written)), "each line in exactly one document"
    es.assert_prompt(es.all_docs(), key_fn=lambda h: h["_source"]["message"], written=written,
                     bound_s=promptness.DEFAULT_BOUND_S + 1.0)      # + the timeout, counted from the last line
