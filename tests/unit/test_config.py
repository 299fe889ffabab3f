"""Config loading: sizes, durations, ${ENV}, defaults, unknown keys with lines, url vs hosts, errors.

Every rejected config must raise `ConfigError` naming the dotted key, with file and line where
the YAML has one: that is what `shipper run|check` prints before exiting 2.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from shipper import settings
from shipper.config import (
    Config,
    DataStreamConfig,
    InputConfig,
    JournaldConfig,
    MultilineConfig,
    TLSConfig,
    expand_env,
    load_config,
    load_config_text,
    parse_duration,
    parse_size,
)
from shipper.errors import ConfigError
from tests.support import spool_mode

MINIMAL = """\
state_dir: /tmp/shipper-state
inputs:
  - paths: ['/var/log/app/*.log']
"""


def load(text: str, env: dict[str, str] | None = None, file: str | None = "/etc/shipper/shipper.yaml") -> Config:
    """The full load the daemon and commands use: config, then the parse side's checks."""
    return settings.load_text(textwrap.dedent(text), file, env if env is not None else {})


def error(text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load(text, env)
    return ei.value


# ---------------------------------------------------------------- value parsers

@pytest.mark.parametrize("text, expected", [
    ("512KiB", 512 * 1024), ("5MiB", 5 * 1024**2), ("1GiB", 1024**3), ("2TiB", 2 * 1024**4),
    ("100", 100), (100, 100), ("100B", 100), ("1.5KiB", 1536), ("5 MiB", 5 * 1024**2),
    ("10kib", 10 * 1024), ("1MB", 1_000_000), ("1K", 1024),
])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["5 megs", "MiB", "-1", -1, True, "1.2.3KiB", "", "5XiB"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_size(bad, "queue.max_bytes")
    assert ei.value.key == "queue.max_bytes"


@pytest.mark.parametrize("text, expected", [
    ("250ms", 0.25), ("10s", 10.0), ("5m", 300.0), ("1h", 3600.0), ("1d", 86400.0), ("1.5s", 1.5),
    (3, 3.0), (0.5, 0.5), ("7", 7.0), ("0s", 0.0),
])
def test_durations(text: object, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["10 seconds", "s", "-5s", -1, False, "1m30s", "10S", ""])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_duration(bad, "retry.max_backoff")


def test_expand_env_forms() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert expand_env("${A}-${A}", env) == "x-x"
    assert expand_env("${MISSING:-fallback}", env) == "fallback"
    assert expand_env("${A:-fallback}", env) == "x"
    assert expand_env("${EMPTY:-fallback}", env) == ""        # set but empty is set
    assert expand_env("${MISSING:-}", env) == ""
    assert expand_env("$A, ${A, ${1A}", env) == "$A, ${A, ${1A}"   # only ${NAME} is a reference
    with pytest.raises(ConfigError) as ei:
        expand_env("${MISSING}", env)
    assert "MISSING" in ei.value.key


# ---------------------------------------------------------------- defaults

def test_defaults_follow_the_spec() -> None:
    cfg = load(MINIMAL)
    (inp,) = cfg.inputs
    assert cfg.state_dir == "/tmp/shipper-state" and cfg.log_level == "info" and cfg.shutdown_timeout_s == 10.0
    assert inp.paths == ("/var/log/app/*.log",) and inp.exclude == () and inp.format == "auto"
    assert inp.pattern is None and inp.multiline is None and dict(inp.fields) == {}
    assert inp.start_at == "beginning" and inp.scan_interval_s == 10.0 and inp.index is None
    assert inp.max_line_bytes == 1024**2 and inp.timezone == "local"
    es = cfg.output
    assert es.hosts == ("http://127.0.0.1:9200",) and es.index == "logs-%Y.%m.%d"
    assert (es.username, es.password, es.api_key, es.pipeline) == (None, None, None, None)
    assert es.compression == "gzip" and es.bulk_max_events == 2000 and es.bulk_max_bytes == 5 * 1024**2
    assert es.flush_interval_s == 1.0 and es.timeout_s == 30.0 and es.tls.verify is True and es.tls.ca_file is None
    assert cfg.queue.max_bytes == 1024**3
    assert cfg.retry.initial_backoff_s == 1.0 and cfg.retry.max_backoff_s == 60.0
    assert cfg.metrics.listen == "127.0.0.1:9607"
    assert cfg.source == "/etc/shipper/shipper.yaml"


def test_explicit_nulls_mean_the_default_and_metrics_null_turns_metrics_off() -> None:
    cfg = load(MINIMAL + """\
        log_level: null
        output:
          elasticsearch:
            index: null
            username: null
            compression: null
        metrics:
          listen: null
        """.replace("        ", ""))
    assert cfg.log_level == "info" and cfg.output.index == "logs-%Y.%m.%d" and cfg.output.compression == "gzip"
    assert cfg.metrics.listen is None


def test_every_spec_key_is_accepted() -> None:
    cfg = load("""\
        state_dir: /var/lib/shipper
        log_level: debug
        shutdown_timeout: 3s
        inputs:
          - paths: ['/var/log/**/*.log']
            exclude: ['*.gz']
            format: regex
            pattern: nginx
            multiline: {start: '^\\d{4}-', max_lines: 50, timeout: 250ms}
            fields: {env: prod, team: {name: core}}
            start_at: end
            scan_interval: 2s
            index: 'app-%Y'
            max_line_bytes: 64KiB
            timezone: Europe/Berlin
        output:
          elasticsearch:
            hosts: ['http://a:9200', 'https://b:9243/']
            index: 'logs-%Y.%m.%d'
            username: elastic
            password: secret
            api_key: null
            compression: none
            bulk_max_events: 500
            bulk_max_bytes: 1MiB
            flush_interval: 250ms
            timeout: 5s
            tls: {verify: false, ca_file: null}
            pipeline: my-pipeline
        queue:
          max_bytes: 10MiB
        retry:
          initial_backoff: 100ms
          max_backoff: 5s
        metrics:
          listen: 127.0.0.1:19607
        """)
    inp = cfg.inputs[0]
    assert inp.multiline is not None and inp.multiline.max_lines == 50 and inp.multiline.timeout_s == 0.25
    assert dict(inp.fields) == {"env": "prod", "team": {"name": "core"}}
    assert inp.start_at == "end" and inp.scan_interval_s == 2.0 and inp.max_line_bytes == 64 * 1024
    assert cfg.output.hosts == ("http://a:9200", "https://b:9243")       # trailing slash dropped
    assert cfg.output.tls.verify is False and cfg.output.compression == "none"
    assert cfg.output.bulk_max_bytes == 1024**2 and cfg.output.flush_interval_s == 0.25
    assert cfg.queue.max_bytes == 10 * 1024**2 and cfg.retry.max_backoff_s == 5.0
    assert cfg.shutdown_timeout_s == 3.0 and cfg.log_level == "debug"


def test_url_is_accepted_as_hosts_but_not_together() -> None:
    cfg = load(MINIMAL + "output:\n  elasticsearch:\n    url: https://logsene-receiver.sematext.com\n")
    assert cfg.output.hosts == ("https://logsene-receiver.sematext.com",)
    err = error(MINIMAL + "output:\n  elasticsearch:\n    url: http://a:9200\n    hosts: ['http://b:9200']\n")
    assert err.key == "output.elasticsearch.url" and "not both" in err.message and err.line == 6


def test_log_level_warn_is_warning() -> None:
    assert load(MINIMAL + "log_level: WARN\n").log_level == "warning"


# ---------------------------------------------------------------- ${ENV}

def test_env_expanded_in_values_not_comments() -> None:
    cfg = load("""\
        # ${NOT_SET_ANYWHERE} in a comment is left alone
        state_dir: ${STATE:-/tmp/default-state}
        inputs:
          - paths: ['${LOGDIR}/*.log']   # ${ALSO_NOT_SET}
        output:
          elasticsearch:
            url: http://${ES_HOST}:9200
            index: ${TOKEN}
            username: elastic
            password: ${ES_PASSWORD}
        """, {"LOGDIR": "/srv/logs", "ES_HOST": "es.local", "TOKEN": "abc-123", "ES_PASSWORD": "pw"})
    assert cfg.state_dir == "/tmp/default-state"
    assert cfg.inputs[0].paths == ("/srv/logs/*.log",)
    assert cfg.output.hosts == ("http://es.local:9200",) and cfg.output.index == "abc-123"
    assert cfg.output.password == "pw"


def test_env_whole_values_are_typed_by_their_key() -> None:
    cfg = load(MINIMAL + textwrap.dedent("""\
        output:
          elasticsearch:
            username: u
            password: ${PW}
            bulk_max_events: ${N}
            bulk_max_bytes: ${SIZE}
            timeout: ${T:-2s}
            compression: ${C:-none}
            tls:
              verify: ${VERIFY}
        metrics:
          listen: ${LISTEN:-}
        """), {"PW": "007", "N": "250", "SIZE": "2MiB", "VERIFY": "false"})
    es = cfg.output
    assert es.password == "007"          # not the number 7
    assert es.bulk_max_events == 250 and es.bulk_max_bytes == 2 * 1024**2 and es.timeout_s == 2.0
    assert es.compression == "none" and es.tls.verify is False
    assert cfg.metrics.listen is None    # empty expansion: not set -> null turns metrics off


@pytest.mark.parametrize("pw", ["0x1F", "on", "yes", "1_000", "017", "null", "~", "1e3", "true"])
def test_env_passwords_that_yaml_would_retype_stay_text(pw: str) -> None:
    cfg = load(MINIMAL + "output:\n  elasticsearch:\n    username: u\n    password: ${PW}\n", {"PW": pw})
    assert cfg.output.password == pw


def test_env_in_fields_is_typed_like_json() -> None:
    cfg = load(MINIMAL + """\
    fields:
      replicas: ${N}
      ratio: ${R}
      canary: ${B}
      pin: ${PIN}
      word: ${W}
      when: 2024-01-01
      7: seven
""", {"N": "3", "R": "0.5", "B": "true", "PIN": "007", "W": "on"})
    fields = dict(cfg.inputs[0].fields)
    assert fields == {"replicas": 3, "ratio": 0.5, "canary": True, "pin": "007", "word": "on",
                      "when": "2024-01-01", "7": "seven"}
    orjson.dumps(fields)   # goes into every document as it is


def test_env_typed_value_of_the_wrong_kind_names_the_key() -> None:
    err = error(MINIMAL + "output:\n  elasticsearch:\n    bulk_max_events: ${N}\n", {"N": "lots"})
    assert err.key == "output.elasticsearch.bulk_max_events" and "whole number" in err.message and err.line == 6
    err = error(MINIMAL + "output:\n  elasticsearch:\n    tls:\n      verify: ${V}\n", {"V": "maybe"})
    assert err.key == "output.elasticsearch.tls.verify" and err.line == 7


def test_unset_env_names_the_variable_the_key_and_the_line() -> None:
    err = error(MINIMAL + "output:\n  elasticsearch:\n    index: ${LOGSENE_TOKEN}\n")
    assert err.key == "output.elasticsearch.index" and "LOGSENE_TOKEN" in err.message and err.line == 6
    assert "line 6" in str(err) and "/etc/shipper/shipper.yaml" in str(err)


# ---------------------------------------------------------------- errors: key, file, line

@pytest.mark.parametrize("text, key, line, words", [
    (MINIMAL + "colour: blue\n", "colour", 4, "unknown key"),
    (MINIMAL + "    colour: blue\n", "inputs[0].colour", 4, "unknown key"),
    (MINIMAL + "output:\n  elasticsearch:\n    hostz: [x]\n", "output.elasticsearch.hostz", 6, "unknown key"),
    (MINIMAL + "output:\n  kafka: {}\n", "output.kafka", 5, "unknown key"),
    (MINIMAL + "queue:\n  max_bytes: 5 megs\n", "queue.max_bytes", 5, "size"),
    (MINIMAL + "queue:\n  max_bytes: 1KiB\n", "queue.max_bytes", 5, "at least"),
    (MINIMAL + "retry:\n  initial_backoff: soon\n", "retry.initial_backoff", 5, "duration"),
    (MINIMAL + "retry:\n  initial_backoff: 5s\n  max_backoff: 1s\n", "retry.max_backoff", 6, "initial_backoff"),
    (MINIMAL + "shutdown_timeout: 10 seconds\n", "shutdown_timeout", 4, "duration"),
    ("state_dir: /tmp/s\ninputs:\n  - exclude: ['*.gz']\n", "inputs[0].paths", 3, "required"),
    ("state_dir: /tmp/s\ninputs:\n  - paths: []\n", "inputs[0].paths", 3, "required"),
    ("state_dir: /tmp/s\ninputs:\n  - paths: ['logs/*.log']\n", "inputs[0].paths", 3, "absolute"),
    ("inputs:\n  - paths: ['/x/*.log']\n    format: regex\n    pattern: '(?P<a>['\n", "inputs[0].pattern", 4, "regular expression"),
    ("inputs:\n  - paths: ['/x/*.log']\n    format: regex\n", "inputs[0].pattern", 2, "pattern"),
    ("inputs:\n  - paths: ['/x/*.log']\n    multiline:\n      start: '(unclosed'\n", "inputs[0].multiline.start", 4, "regular expression"),
    ("inputs:\n  - paths: ['/x/*.log']\n    format: xml\n", "inputs[0].format", 3, "auto, json, text, regex"),
    ("inputs:\n  - paths: ['/x/*.log']\n    start_at: middle\n", "inputs[0].start_at", 3, "beginning, end"),
    ("inputs:\n  - paths: ['/x/*.log']\n    timezone: Mars/Olympus\n", "inputs[0].timezone", 3, "time zone"),
    ("inputs:\n  - paths: ['/x/*.log']\n    max_line_bytes: 4\n", "inputs[0].max_line_bytes", 3, "at least"),
    # bounded: a longer line could not be indexed, and the C scan's counters stay far from 2**31
    ("inputs:\n  - paths: ['/x/*.log']\n    max_line_bytes: 3GiB\n", "inputs[0].max_line_bytes", 3, "at most 67108864 bytes (64MiB"),
    ("inputs:\n  - paths: ['/x/*.log']\n    max_line_bytes: 67108865\n", "inputs[0].max_line_bytes", 3, "Elasticsearch refuses"),
    ("inputs:\n  - paths: 5\n", "inputs[0].paths", 2, "list of strings"),
    ("inputs:\n  paths: ['/x']\n", "inputs", 1, "list"),
    ("inputs:\n  - paths: ['/x/*.log']\n    fields: [a, b]\n", "inputs[0].fields", 3, "mapping"),
    (MINIMAL + "output:\n  elasticsearch:\n    bulk_max_events: many\n", "output.elasticsearch.bulk_max_events", 6, "whole number"),
    (MINIMAL + "output:\n  elasticsearch:\n    bulk_max_events: 0\n", "output.elasticsearch.bulk_max_events", 6, "at least 1"),
    (MINIMAL + "output:\n  elasticsearch:\n    bulk_max_events: true\n", "output.elasticsearch.bulk_max_events", 6, "whole number"),
    (MINIMAL + "output:\n  elasticsearch:\n    compression: brotli\n", "output.elasticsearch.compression", 6, "gzip, none"),
    (MINIMAL + "output:\n  elasticsearch:\n    hosts: ['localhost:9200']\n", "output.elasticsearch.hosts", 6, "http://"),
    (MINIMAL + "output:\n  elasticsearch:\n    hosts: []\n", "output.elasticsearch.hosts", 6, "at least one"),
    (MINIMAL + "output:\n  elasticsearch:\n    tls: true\n", "output.elasticsearch.tls", 6, "mapping"),
    (MINIMAL + "output:\n  elasticsearch:\n    tls:\n      verify: perhaps\n", "output.elasticsearch.tls.verify", 7, "true or false"),
    (MINIMAL + "output:\n  elasticsearch:\n    password: pw\n", "output.elasticsearch.password", 6, "username"),
    (MINIMAL + "output:\n  elasticsearch:\n    index: ['a']\n", "output.elasticsearch.index", 6, "string"),
    (MINIMAL + "metrics:\n  listen: 9607\n", "metrics.listen", 5, "HOST:PORT"),
    (MINIMAL + "metrics:\n  listen: '::1:9607'\n", "metrics.listen", 5, "in brackets"),
    (MINIMAL + "log_level: loud\n", "log_level", 4, "debug, info, warning, error"),
    (MINIMAL + "state_dir: /other\n", "state_dir", 4, "duplicate"),
    # checked by shipper.parse.validate after loading, the line from Config.key_lines
    ("inputs:\n  - paths: ['/x/*.log']\n    format: regex\n    pattern: '(?P<a>x)(?P<a__b>y)'\n",
     "inputs[0].pattern", 4, "collide"),
    ("inputs:\n  - paths: ['/x/*.log']\n  - paths: ['/y/*.log']\n    mask: {'(a)': 'x\\2'}\n",
     "inputs[1].mask", 4, "invalid replacement"),
    ("inputs:\n  - paths: ['/x/*.log']\n    drop_fields: [a]\n    mask: {'a': '\\g<nope>'}\n",
     "inputs[0].mask", 4, "invalid replacement"),
    ("- just\n- a list\n", "(top level)", None, "mapping"),
])
def test_errors_name_the_key_and_line(text: str, key: str, line: int | None, words: str) -> None:
    err = error(text)
    assert err.key == key, str(err)
    assert err.line == line, str(err)
    assert words in err.message, str(err)
    assert err.file == "/etc/shipper/shipper.yaml"
    assert key in str(err) and (line is None or f"line {line}" in str(err))


def test_max_line_bytes_may_be_64MiB_exactly() -> None:
    cfg = load("state_dir: /tmp/s\ninputs:\n  - paths: ['/x/*.log']\n    max_line_bytes: 64MiB\n")
    assert cfg.inputs[0].max_line_bytes == 64 * 1024 * 1024


def test_yaml_syntax_error_has_a_line() -> None:
    err = error(MINIMAL + "output: [unclosed\n")
    assert err.key == "(syntax)" and err.line is not None and err.line >= 4


def test_load_config_reads_a_file_and_names_it(tmp_path: Path) -> None:
    p = tmp_path / "shipper.yaml"
    p.write_text(MINIMAL + "inputz: []\n")
    with pytest.raises(ConfigError) as ei:
        load_config(str(p), env={})
    assert ei.value.file == str(p) and ei.value.line == 4 and ei.value.key == "inputz"
    with pytest.raises(ConfigError) as ei:
        load_config(str(tmp_path / "missing.yaml"), env={})
    assert "not found" in ei.value.message
    p.write_text(MINIMAL)
    assert load_config(str(p), env={}).source == str(p)


def test_an_empty_file_is_all_defaults() -> None:
    cfg = load("")
    assert cfg.inputs == () and cfg.state_dir == "/var/lib/shipper"


@pytest.mark.parametrize("listen", ["[::1]:9607", "[::]:9607", "0.0.0.0:9607", ":9607", "localhost:9607"])
def test_metrics_listen_takes_ipv4_names_and_bracketed_ipv6(listen: str) -> None:
    assert load(MINIMAL + f"metrics:\n  listen: '{listen}'\n").metrics.listen == listen


def test_flush_min_interval_defaults_to_40ms_and_takes_zero() -> None:
    base = "inputs: [{paths: ['/x/*.log']}]\n"
    assert load(base).output.flush_min_interval_s == 0.04
    assert load(base + "output: {elasticsearch: {flush_min_interval: 0}}\n").output.flush_min_interval_s == 0.0
    assert load(base + "output: {elasticsearch: {flush_min_interval: 5ms}}\n").output.flush_min_interval_s == 0.005
    e = error(base + "output: {elasticsearch: {flush_min_interval: soon}}\n")
    assert "output.elasticsearch.flush_min_interval" in str(e)


# ---------------------------------------------------------------- defaults written once

def fields_of(value: Any) -> dict[str, Any]:
    """Field by field, `compare=False` ones (key_lines) included."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def test_loading_nothing_gives_exactly_the_dataclass_defaults() -> None:
    cfg = load_config_text("{}\n", None, {})
    assert fields_of(cfg) == fields_of(Config())
    assert fields_of(cfg.output) == fields_of(Config().output)
    assert cfg == Config()


def test_an_input_with_only_paths_gives_exactly_the_dataclass_defaults() -> None:
    cfg = load_config_text("inputs:\n  - paths: ['/x/*.log']\n    multiline: {start: '^x'}\n"
                           "output:\n  elasticsearch:\n    data_stream: {}\n    tls: {}\n", None, {})
    (inp,) = cfg.inputs
    assert fields_of(inp) == fields_of(InputConfig(paths=("/x/*.log",), multiline=MultilineConfig(start="^x")))
    assert fields_of(inp.multiline) == fields_of(MultilineConfig(start="^x"))
    assert cfg.output.data_stream == DataStreamConfig() and cfg.output.tls == TLSConfig()
    (j,) = load_config_text("inputs:\n  - journald: {}\n", None, {}).inputs
    assert fields_of(j) == fields_of(InputConfig(paths=(), journald=JournaldConfig()))


def test_key_lines_map_dotted_keys_to_their_lines() -> None:
    cfg = load(MINIMAL)
    assert cfg.key_lines["state_dir"] == 1 and cfg.key_lines["inputs[0].paths"] == 3


def test_config_alone_accepts_what_only_the_parsers_reject() -> None:
    text = "inputs:\n  - paths: ['/x/*.log']\n    format: regex\n    pattern: '(?P<a>x)(?P<a__b>y)'\n"
    assert load_config_text(text, None, {}).inputs[0].pattern == "(?P<a>x)(?P<a__b>y)"
    with pytest.raises(ConfigError):
        settings.load_text(text, None, {})


def test_config_does_not_import_parse() -> None:
    code = "import sys, shipper.config; print(sorted(m for m in sys.modules if m.startswith('shipper.parse')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_settings_load_reads_a_file_and_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "shipper.yaml"
    p.write_text("inputs:\n  - paths: ['/x/*.log']\n    format: regex\n    pattern: '(?P<a>x)(?P<a__b>y)'\n")
    with pytest.raises(ConfigError) as ei:
        settings.load(str(p), env={})
    assert (ei.value.key, ei.value.file, ei.value.line) == ("inputs[0].pattern", str(p), 4)
    p.write_text(MINIMAL)
    assert settings.load(str(p), env={}).source == str(p)


# ---------------------------------------------------------------- journald inputs

def test_a_journald_input() -> None:
    cfg = load("""
        inputs:
          - journald: {directory: /var/log/journal, units: [app.service, web]}
            start_at: end
            format: json
          - journald:
          - paths: ['/var/log/*.log']
        """)
    j, system, files = cfg.inputs
    assert j.journald == JournaldConfig("/var/log/journal", ("app.service", "web")) and j.paths == ()
    assert (j.start_at, j.format) == ("end", "json")
    assert system.journald == JournaldConfig(None, ()) and files.journald is None


@pytest.mark.parametrize("text, key, words", [
    ("inputs:\n  - paths: ['/a/*.log']\n    journald: {}\n", "inputs[0].journald", "either paths or journald"),
    ("inputs:\n  - format: json\n", "inputs[0].paths", "or journald"),
    ("inputs:\n  - journald: {directory: rel/dir}\n", "inputs[0].journald.directory", "absolute"),
    ("inputs:\n  - journald: {units: ['a b']}\n", "inputs[0].journald.units[0]", "unit name"),
    ("inputs:\n  - journald: {unit: [a]}\n", "inputs[0].journald.unit", "unknown key"),
    ("inputs:\n  - journald: [a]\n", "inputs[0].journald", "mapping"),
    ("inputs:\n  - journald: {}\n    exclude: ['*.gz']\n", "inputs[0].exclude", "paths only"),
])
def test_journald_errors_name_the_key(text: str, key: str, words: str) -> None:
    e = error(text)
    assert e.key == key and words in e.message


@pytest.mark.parametrize("fmt", ["docker", "cri"])
def test_container_formats(fmt: str) -> None:
    cfg = load(f"state_dir: /tmp/s\ninputs:\n  - paths: ['/var/log/containers/*.log']\n    format: {fmt}\n")
    assert cfg.inputs[0].format == fmt


def test_the_sample_config_spells_out_the_defaults() -> None:
    """config/shipper.yaml is the documented starting point: every value it writes out is the
    loader's default (it once kept flush_min_interval at 20ms after the default had moved on)."""
    path = Path(__file__).resolve().parents[2] / "config" / "shipper.yaml"
    with spool_mode.product_default():      # the suite may run with queue.spool: always as its default
        sample = load(path.read_text(), file=str(path))
        data = yaml.safe_load(path.read_text())
        minimal = load(yaml.safe_dump({"inputs": data["inputs"],
                                       "output": {"elasticsearch": {"hosts": data["output"]["elasticsearch"]["hosts"]}}}),
                       file=str(path))
    assert dataclasses.replace(sample, key_lines=minimal.key_lines) == minimal
