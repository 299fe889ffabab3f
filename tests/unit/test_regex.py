"""Unit tests for shipper.parse.regex: nginx/apache combined logs, RFC 3164/5424 syslog, user patterns."""

from __future__ import annotations

import calendar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.parse.regex import RegexParser

NOW = calendar.timegm((2026, 11, 30, 12, 0, 0))

NGINX_FULL = ('203.0.113.7 - alice [30/Nov/2026:11:59:58 +0000] "GET /api/v1/items?page=2&sort=price HTTP/1.1" '
              '200 5123 "https://shop.example.com/cart" '
              '"Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"')
NGINX_V6 = ('2001:db8:85a3::8a2e:370:7334 - - [30/Nov/2026:12:59:59 +0100] "POST /login HTTP/2.0" '
            '302 0 "-" "curl/8.5.0"')
APACHE = ('192.0.2.44 - frank [10/Oct/2026:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 304 - '
          '"http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)"')


def test_nginx_combined_line() -> None:
    doc = RegexParser("nginx").parse(NGINX_FULL, NOW)
    assert doc == {
        "source": {"address": "203.0.113.7"},
        "user": {"name": "alice"},
        "http": {"request": {"method": "GET", "referrer": "https://shop.example.com/cart"},
                 "version": "1.1",
                 "response": {"status_code": 200, "body": {"bytes": 5123}}},
        "url": {"original": "/api/v1/items?page=2&sort=price"},
        "user_agent": {"original": "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"},
        "@timestamp": "2026-11-30T11:59:58.000Z",
    }
    assert "message" not in doc


def test_nginx_ipv6_source_and_dash_values() -> None:
    doc = RegexParser("nginx").parse(NGINX_V6, NOW)
    assert doc is not None
    assert doc["source"] == {"address": "2001:db8:85a3::8a2e:370:7334"}
    assert "user" not in doc                              # `-` user
    assert "referrer" not in doc["http"]["request"]       # `-` referrer
    assert doc["http"]["response"] == {"status_code": 302, "body": {"bytes": 0}}
    assert doc["http"]["version"] == "2.0"
    assert doc["@timestamp"] == "2026-11-30T11:59:59.000Z"


def test_apache_combined_with_dash_bytes() -> None:
    doc = RegexParser("apache").parse(APACHE, NOW)
    assert doc is not None
    assert doc["http"]["response"] == {"status_code": 304}   # `-` bytes: absent, not 0
    assert doc["user"] == {"name": "frank"}
    assert doc["http"]["request"]["referrer"] == "http://www.example.com/start.html"
    assert doc["user_agent"]["original"] == "Mozilla/4.08 [en] (Win98; I ;Nav)"
    assert doc["@timestamp"] == "2026-10-10T20:55:36.000Z"
    assert isinstance(doc["http"]["response"]["status_code"], int)


def test_apache_common_log_format_without_referrer_and_agent() -> None:
    line = '127.0.0.1 - - [10/Oct/2026:13:55:36 -0700] "GET /index.html HTTP/1.1" 200 2326'
    doc = RegexParser("apache").parse(line, NOW)
    assert doc is not None
    assert "user_agent" not in doc and "referrer" not in doc["http"]["request"]
    assert doc["http"]["response"]["body"]["bytes"] == 2326


def test_quotes_escaped_inside_fields_and_trailing_extras() -> None:
    line = ('198.51.100.2 - - [30/Nov/2026:11:00:00 +0000] "GET /search?q=\\"x\\" HTTP/1.1" 200 12 '
            '"-" "bot \\"quoted\\"/1.0" "10.1.1.1" rt=0.003')
    doc = RegexParser("nginx").parse(line, NOW)
    assert doc is not None
    assert doc["url"]["original"] == '/search?q=\\"x\\"'
    assert doc["user_agent"]["original"] == 'bot \\"quoted\\"/1.0'


def test_junk_request_keeps_status_but_no_method() -> None:
    line = '45.9.20.1 - - [30/Nov/2026:11:00:00 +0000] "\\x16\\x03\\x01\\x00\\xee\\x01" 400 157 "-" "-"'
    doc = RegexParser("nginx").parse(line, NOW)
    assert doc is not None
    assert doc["http"] == {"response": {"status_code": 400, "body": {"bytes": 157}}}
    assert "url" not in doc and "user_agent" not in doc


@pytest.mark.parametrize("line", [
    "", "hello world", '203.0.113.7 - - [30/Nov/2026:11:59:58 +0000] "GET / HTTP/1.1" abc 12',
    "2026-11-30 12:00:00 INFO something",
])
def test_combined_non_matching_lines(line: str) -> None:
    assert RegexParser("nginx").parse(line, NOW) is None


# ---------------------------------------------------------------- syslog

def test_rfc3164_with_priority_and_pid() -> None:
    line = "<34>Oct 11 22:14:15 mymachine su[230]: 'su root' failed for lonvick on /dev/pts/8"
    doc = RegexParser("syslog", "UTC").parse(line, NOW)
    assert doc == {
        "log": {"syslog": {"priority": 34,
                           "facility": {"code": 4, "name": "auth"},
                           "severity": {"code": 2, "name": "Critical"}}},
        "host": {"hostname": "mymachine"},
        "process": {"name": "su", "pid": 230},
        "message": "'su root' failed for lonvick on /dev/pts/8",
        "@timestamp": "2026-10-11T22:14:15.000Z",
    }


def test_rfc3164_as_rsyslog_writes_files() -> None:
    p = RegexParser("syslog", "Europe/Berlin")
    doc = p.parse("Oct  1 02:03:04 web-01 kernel: [ 1234.567890] eth0: link up", NOW)
    assert doc == {"host": {"hostname": "web-01"}, "process": {"name": "kernel"},
                   "message": "[ 1234.567890] eth0: link up",
                   "@timestamp": "2026-10-01T00:03:04.000Z"}   # CEST is UTC+2
    doc = p.parse("Nov 30 12:59:01 web-01 CRON[4711]: (root) CMD (run-parts /etc/cron.hourly)", NOW)
    assert doc is not None
    assert doc["process"] == {"name": "CRON", "pid": 4711}
    assert doc["@timestamp"] == "2026-11-30T11:59:01.000Z"        # CET is UTC+1
    doc = p.parse("Nov 30 12:59:02 web-01 postfix/smtpd[802]: connect from unknown[192.0.2.9]", NOW)
    assert doc is not None and doc["process"] == {"name": "postfix/smtpd", "pid": 802}


def test_rfc3164_with_rfc3339_timestamp_and_no_tag() -> None:
    p = RegexParser("syslog", "UTC")
    doc = p.parse("2026-11-30T11:58:01.123456+01:00 web-01 systemd[1]: Started session 42.", NOW)
    assert doc is not None
    assert doc["@timestamp"] == "2026-11-30T10:58:01.123Z"
    assert doc["process"] == {"name": "systemd", "pid": 1}
    doc = p.parse("Nov 30 11:00:00 web-01 last message repeated 3 times", NOW)
    assert doc is not None
    assert "process" not in doc and doc["message"] == "last message repeated 3 times"


def test_rfc3164_year_rollover() -> None:
    jan1 = calendar.timegm((2027, 1, 1, 0, 0, 10))
    doc = RegexParser("syslog", "UTC").parse("<13>Dec 31 23:59:59 db-2 backup[77]: done", jan1)
    assert doc is not None and doc["@timestamp"] == "2026-12-31T23:59:59.000Z"


def test_rfc5424_with_structured_data() -> None:
    line = ('<165>1 2026-11-30T11:59:59.003Z mymachine.example.com evntslog - ID47 '
            '[exampleSDID@32473 iut="3" eventSource="Application" eventID="1011"]'
            '[examplePriority@32473 class="high"] \ufeffAn application event log entry...')
    doc = RegexParser("syslog").parse(line, NOW)
    assert doc == {
        "log": {"syslog": {
            "priority": 165,
            "facility": {"code": 20, "name": "local4"},
            "severity": {"code": 5, "name": "Notice"},
            "msgid": "ID47",
            "structured_data": {"exampleSDID@32473": {"iut": "3", "eventSource": "Application",
                                                      "eventID": "1011"},
                                "examplePriority@32473": {"class": "high"}}}},
        "host": {"hostname": "mymachine.example.com"},
        "process": {"name": "evntslog"},
        "message": "An application event log entry...",
        "@timestamp": "2026-11-30T11:59:59.003Z",
    }


def test_rfc5424_nil_values() -> None:
    doc = RegexParser("syslog").parse("<34>1 - - - - - - ", NOW)
    assert doc == {"log": {"syslog": {"priority": 34, "facility": {"code": 4, "name": "auth"},
                                      "severity": {"code": 2, "name": "Critical"}}}}
    doc = RegexParser("syslog").parse("<13>1 2026-11-30T12:00:00+01:00 app-7 - 4711 - - worker started", NOW)
    assert doc is not None
    assert doc["process"] == {"pid": 4711}
    assert doc["host"] == {"hostname": "app-7"}
    assert doc["message"] == "worker started"
    assert doc["@timestamp"] == "2026-11-30T11:00:00.000Z"


def test_rfc5424_without_pri_escapes_and_text_procid() -> None:
    line = '1 2026-11-30T12:00:00Z host app worker-3 M1 [meta x="a\\]b" y="q\\"uote\\\\"] hello'
    doc = RegexParser("syslog").parse(line, NOW)
    assert doc is not None
    syslog = doc["log"]["syslog"]
    assert "priority" not in syslog
    assert syslog["procid"] == "worker-3" and "pid" not in doc["process"]
    assert syslog["structured_data"] == {"meta": {"x": "a]b", "y": 'q"uote\\'}}
    assert doc["message"] == "hello"


def test_rfc5424_malformed_structured_data_stays_in_message() -> None:
    doc = RegexParser("syslog").parse('<14>1 2026-11-30T12:00:00Z h a 1 - [broken x="1" msg', NOW)
    assert doc is not None
    assert doc["message"] == '[broken x="1" msg'
    assert "structured_data" not in doc["log"]["syslog"]


@pytest.mark.parametrize("line", ["", "just some text", "<999>Oct 11 22:14:15 host app: x",
                                  "<34>", "Oct 11 host app: x"])
def test_syslog_non_matching(line: str) -> None:
    assert RegexParser("syslog").parse(line, NOW) is None


# ---------------------------------------------------------------- user patterns

APP_PATTERN = (r"^(?P<timestamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) \[(?P<log__level>\w+)\] "
               r"(?P<service__name>[\w-]+): (?P<message>.*)$")


def test_user_pattern_nests_double_underscore_and_sets_timestamp() -> None:
    p = RegexParser(APP_PATTERN, "UTC")
    doc = p.parse("2026-11-30 11:59:59,250 [ERROR] billing-api: payment failed for order 991", NOW)
    assert doc == {"@timestamp": "2026-11-30T11:59:59.250Z", "log": {"level": "ERROR"},
                   "service": {"name": "billing-api"}, "message": "payment failed for order 991"}


def test_user_pattern_values_stay_strings_and_no_message_unless_grouped() -> None:
    p = RegexParser(r"status=(?P<http__status>\d+) took=(?P<took_ms>\d+)ms(?: user=(?P<user>\S+))?")
    doc = p.parse("GET /x status=200 took=17ms", NOW)   # searched anywhere, optional group absent
    assert doc == {"http": {"status": "200"}, "took_ms": "17"}


def test_user_pattern_unparseable_timestamp_is_kept_raw() -> None:
    p = RegexParser(r"^(?P<timestamp>\S+) (?P<message>.*)")
    assert p.parse("yesterday disk full", NOW) == {"timestamp": "yesterday", "message": "disk full"}


def test_user_pattern_no_match() -> None:
    assert RegexParser(APP_PATTERN).parse("garbage", NOW) is None


@pytest.mark.parametrize("pattern", [
    r"(x)", r"((", r"(?P<a>x)(?P<a__b>y)", r"(?P<message__text>x)", r"(?P<__>x)",
])
def test_bad_user_patterns_raise_value_error(pattern: str) -> None:
    with pytest.raises(ValueError):
        RegexParser(pattern)


def test_rfc5424_repeated_param_becomes_a_list() -> None:
    line = '<14>1 2026-11-30T12:00:00Z h a - - [origin ip="192.0.2.1" ip="2001:db8::1"] up'
    doc = RegexParser("syslog").parse(line, NOW)
    assert doc is not None
    assert doc["log"]["syslog"]["structured_data"] == {"origin": {"ip": ["192.0.2.1", "2001:db8::1"]}}


def test_user_pattern_on_a_joined_multiline_event() -> None:
    p = RegexParser(r"(?s)^(?P<timestamp>\S+ \S+) (?P<log__level>\w+) (?P<message>.*)$", "UTC")
    doc = p.parse("2026-11-30 12:00:00,001 ERROR boom\nTraceback (most recent call last):\n  x", NOW)
    assert doc is not None
    assert doc["message"] == "boom\nTraceback (most recent call last):\n  x"
    assert doc["@timestamp"] == "2026-11-30T12:00:00.001Z"


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_builtins_never_raise(text: str) -> None:
    for name in ("nginx", "syslog"):
        doc = RegexParser(name).parse(text, NOW)
        assert doc is None or isinstance(doc, dict)
    doc = RegexParser("syslog").parse("<13>1 - h a - - " + text, NOW)
    assert doc is None or isinstance(doc, dict)
