"""YAML -> frozen dataclasses: `${ENV}` expanded, sizes and durations, defaults, unknown keys
refused; every error a ConfigError naming the key (and the line). Reads only the file it is given;
inputs[] is config_inputs.py's, output's parts config_output.py's, and whether a pattern compiles
is parse/validate.py's (settings.load runs both)."""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from shipper.config_inputs import MAX_LINE_BYTES_LIMIT as MAX_LINE_BYTES_LIMIT  # re-exported, as the seven below
from shipper.config_inputs import EcsMode as EcsMode
from shipper.config_inputs import Format as Format
from shipper.config_inputs import InputConfig as InputConfig
from shipper.config_inputs import JournaldConfig as JournaldConfig
from shipper.config_inputs import MultilineConfig as MultilineConfig
from shipper.config_inputs import StartAt as StartAt
from shipper.config_inputs import Symlinks as Symlinks
from shipper.config_inputs import read_input
from shipper.config_output import AwsSigV4Config as AwsSigV4Config  # re-exported, as the three below
from shipper.config_output import DataStreamConfig as DataStreamConfig
from shipper.config_output import IndexTemplateMode as IndexTemplateMode
from shipper.config_output import TLSConfig as TLSConfig
from shipper.config_output import read_aws_sigv4, read_data_stream, read_tls
from shipper.config_processors import ConditionConfig as ConditionConfig  # re-exported, as the two below
from shipper.config_processors import SampleConfig as SampleConfig
from shipper.config_processors import ThrottleConfig as ThrottleConfig
from shipper.config_values import Lines as _Lines
from shipper.config_values import Section as _Section
from shipper.config_values import decode_cloud_id as decode_cloud_id  # re-exported, as the four below
from shipper.config_values import expand_env as expand_env
from shipper.config_values import expand_values as _expand_values
from shipper.config_values import parse_duration as parse_duration
from shipper.config_values import parse_fingerprint as parse_fingerprint
from shipper.config_values import parse_size as parse_size
from shipper.errors import ConfigError
from shipper.statedir import state_dir_problem

DEFAULT_CONFIG_PATH = "/etc/shipper/shipper.yaml"
DEFAULT_STATE_DIR = "/var/lib/shipper"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9607"
LOGSENE_RECEIVER = "https://logsene-receiver.sematext.com"
LOGSENE_RECEIVER_EU = "https://logsene-receiver.eu.sematext.com"

DocumentIdMode = Literal["auto", "none"]


@dataclass(frozen=True, slots=True)
class ElasticsearchConfig:
    hosts: tuple[str, ...] = ("http://127.0.0.1:9200",)
    index: str = "logs-%Y.%m.%d"
    username: str | None = None
    password: str | None = None
    api_key: str | None = None
    compression: Literal["gzip", "none"] = "gzip"
    bulk_max_events: int = 2000
    bulk_max_bytes: int = 5 * 1024 * 1024
    flush_interval_s: float = 1.0
    flush_min_interval_s: float = 0.04    # extension: caught up, partial batches leave at most this often (docs/performance.md: the trade)
    timeout_s: float = 30.0
    tls: TLSConfig = field(default_factory=TLSConfig)
    pipeline: str | None = None
    max_in_flight: int = 4
    index_template: IndexTemplateMode = "auto"
    data_stream: DataStreamConfig | None = None   # set: `index` is the data stream's name
    cloud_id: str | None = None                    # set: `hosts` is the deployment's decoded https URL
    document_id: DocumentIdMode = "auto"           # none: `create` without `_id`, at least once
    proxy_url: str | None = None                   # a forward proxy for every host (NO_PROXY still exempts)
    # per host, in `hosts` order: (where it came from, the proxy URL) or None for a direct connection;
    # resolved at load from proxy_url and the environment (https_proxy, http_proxy, no_proxy); (): all direct
    host_proxies: tuple[tuple[str, str] | None, ...] = ()
    aws_sigv4: AwsSigV4Config | None = None        # set: every request signed (Amazon OpenSearch)

    def cleartext_credentials(self) -> list[str]:
        """What credentials would cross the network unencrypted, one sentence each, none of them
        shown: `password`/`api_key`/a URL's password to an http:// host, and a proxy's password
        (proxies are http://: its Proxy-Authorization is sent in the clear). For the warning at
        start and in `shipper check` (SPEC, Trust boundaries)."""
        from urllib.parse import urlsplit
        out: list[str] = []
        for i, host in enumerate(self.hosts):
            parts = urlsplit(host)
            shown = _without_userinfo(parts)
            which = [name for name, v in (("password", self.password), ("api_key", self.api_key)) if v]
            if parts.password:
                which.append("the password in the URL")
            if parts.scheme == "http" and which:
                out.append(f"credentials ({', '.join(which)}) are sent unencrypted to http://{shown}: "
                           "anyone on the way can read them; use https://")
            chosen = self.host_proxies[i] if i < len(self.host_proxies) else None
            if chosen is not None:
                origin, proxy = chosen
                p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
                if p.username is not None:
                    line = (f"the proxy's credentials ({origin}) are sent unencrypted to http://{_without_userinfo(p)}"
                            " (proxies are reached over http://)")
                    if line not in out:
                        out.append(line)
        return out


def _without_userinfo(parts: Any) -> str:
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}" if parts.port else host


@dataclass(frozen=True, slots=True)
class QueueConfig:
    max_bytes: int = 1024**3
    # when_behind: events go out from memory and only what is not acknowledged within
    # spill_after is written to the queue; always: every event is queued before it is sent
    spool: Literal["when_behind", "always"] = "when_behind"
    spill_after_s: float = 1.0


@dataclass(frozen=True, slots=True)
class RetryConfig:
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen: str | None = DEFAULT_METRICS_LISTEN
    health_down_after_s: float = 60.0     # /health answers 503 once the output has been down this long
    status: bool = False                  # /status (paths, hosts) on a non-loopback `listen` too


@dataclass(frozen=True, slots=True)
class Config:
    state_dir: str = DEFAULT_STATE_DIR
    log_level: str = "info"
    shutdown_timeout_s: float = 10.0
    inputs: tuple[InputConfig, ...] = ()
    output: ElasticsearchConfig = field(default_factory=ElasticsearchConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    max_open_files: int = 1024
    clean_removed_after_s: float = 3600.0   # checkpoints of files gone and fully shipped are forgotten after this
    source: str | None = None
    # dotted key -> its line in `source`, so checks made after loading (shipper.parse.validate) name the line
    key_lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)


# The defaults, as the dataclasses give them: the loader reads every default from these.
_TOP_DEFAULTS = Config()
_ES_DEFAULTS = _TOP_DEFAULTS.output
_QUEUE_DEFAULTS = _TOP_DEFAULTS.queue
_RETRY_DEFAULTS = _TOP_DEFAULTS.retry
_METRICS_DEFAULTS = _TOP_DEFAULTS.metrics


def _index_template(es: _Section, lines: _Lines) -> IndexTemplateMode:
    v = es.raw("index_template")
    if v is False:                          # YAML 1.1 reads a bare `off` as false
        return "off"
    if v is True:
        return "auto"
    mode: IndexTemplateMode = es.string("index_template", _ES_DEFAULTS.index_template, ("auto", "off"))
    return mode


def _host_proxies(hosts: tuple[str, ...], proxy_url: str | None, env: Mapping[str, str],
                  lines: _Lines) -> tuple[tuple[str, str] | None, ...]:
    """Which proxy each host is reached through; a proxy URL that does not parse names its key or variable."""
    from urllib.parse import urlsplit

    from shipper.ship.proxy import chosen_proxy, parse_proxy
    out: list[tuple[str, str] | None] = []
    for h in hosts:
        parts = urlsplit(h)
        chosen = chosen_proxy(parts.scheme.lower(), parts.hostname or "", proxy_url, env)
        if chosen is not None:
            from_config = chosen[0].startswith("output.")
            try:
                parse_proxy(chosen[1], chosen[0] if from_config else f"{chosen[0]} (environment)")
            except ConfigError as e:
                raise (lines.error(e.key, e.message) if from_config else e) from None
        out.append(chosen)
    return tuple(out) if any(out) else ()


def _output(data: Any, lines: _Lines, env: Mapping[str, str] | None = None) -> ElasticsearchConfig:
    top = _Section(data, "output", lines)
    es = _Section(top.raw("elasticsearch"), "output.elasticsearch", lines)
    top.finish()
    if es.has("url") and es.has("hosts"):
        raise lines.error("output.elasticsearch.url", "give either url or hosts, not both")
    cloud_id = es.string("cloud_id", None)
    if cloud_id is not None and (es.has("url") or es.has("hosts")):
        raise lines.error("output.elasticsearch.cloud_id", "give either cloud_id or hosts/url, not both")
    if cloud_id is not None:
        try:
            hosts: tuple[str, ...] = (decode_cloud_id(cloud_id, "output.elasticsearch.cloud_id"),)
        except ConfigError as e:
            raise lines.error(e.key, e.message) from None
    elif es.has("url"):
        hosts = (es.string("url", None),)
    else:
        hosts = es.strings("hosts", _ES_DEFAULTS.hosts)
    if not hosts or not all(hosts):
        raise lines.error("output.elasticsearch.hosts", "at least one host URL is required")
    for h in hosts:
        if not re.match(r"^https?://[^/\s]+", h):
            raise lines.error("output.elasticsearch.hosts", f"expected http:// or https:// URL, got {h!r}")
    tls = TLSConfig()
    if es.raw("tls") is not None:
        t = _Section(es.raw("tls"), "output.elasticsearch.tls", lines)
        ca = t.string("ca_file", None)
        if ca and not os.path.exists(ca):
            raise lines.error("output.elasticsearch.tls.ca_file", f"file not found: {ca}")
        tls = read_tls(t, ca, lines)
        t.finish()
    data_stream = read_data_stream(es, lines)
    if data_stream is not None and es.data.get("index") is not None:
        raise lines.error("output.elasticsearch.index", "give either index or data_stream, not both "
                                                        "(a data stream's name is <type>-<dataset>-<namespace>)")
    index = data_stream.name if data_stream is not None else es.string("index", _ES_DEFAULTS.index)
    if not index:
        raise lines.error("output.elasticsearch.index", "must not be empty")
    proxy_url = es.string("proxy_url", None) or None
    aws_sigv4 = read_aws_sigv4(es, os.environ if env is None else env, lines)
    if aws_sigv4 is not None and any(urlsplit(h).username for h in hosts):
        raise lines.error("output.elasticsearch.aws_sigv4", "signs every request with AWS credentials: "
                                                            "not together with credentials in a host URL")
    username = es.string("username", None)
    password = es.string("password", None)
    if password is not None and username is None:
        raise lines.error("output.elasticsearch.password", "is set but output.elasticsearch.username is not")
    cfg = ElasticsearchConfig(
        hosts=tuple(h.rstrip("/") for h in hosts),
        index=index,
        username=username,
        password=password,
        api_key=es.string("api_key", None),
        compression=es.string("compression", _ES_DEFAULTS.compression, ("gzip", "none")),
        bulk_max_events=es.integer("bulk_max_events", _ES_DEFAULTS.bulk_max_events),
        bulk_max_bytes=es.size("bulk_max_bytes", _ES_DEFAULTS.bulk_max_bytes, minimum=1024),
        flush_interval_s=es.duration("flush_interval", _ES_DEFAULTS.flush_interval_s, positive=True),
        flush_min_interval_s=es.duration("flush_min_interval", _ES_DEFAULTS.flush_min_interval_s),
        timeout_s=es.duration("timeout", _ES_DEFAULTS.timeout_s, positive=True),
        tls=tls,
        pipeline=es.string("pipeline", None),
        max_in_flight=es.integer("max_in_flight", _ES_DEFAULTS.max_in_flight),
        index_template=_index_template(es, lines),
        data_stream=data_stream,
        cloud_id=cloud_id,
        document_id=es.string("document_id", _ES_DEFAULTS.document_id, ("auto", "none")),
        proxy_url=proxy_url,
        host_proxies=_host_proxies(tuple(h.rstrip("/") for h in hosts), proxy_url,
                                   os.environ if env is None else env, lines),
        aws_sigv4=aws_sigv4,
    )
    es.finish()
    return cfg


def load_config_text(text: str, file: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Parse and validate config text. Raises ConfigError naming the key."""
    lines = _Lines(file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError("(syntax)", f"invalid YAML: {getattr(e, 'problem', e)}", file,
                          mark.line + 1 if mark else None) from None
    lines.walk(node, "")
    data = _expand_values(data, "", lines, env)
    s = _Section(data, "", lines)
    inputs_raw = s.raw("inputs")
    if inputs_raw is None:
        inputs_raw = []
    if not isinstance(inputs_raw, list):
        raise lines.error("inputs", "expected a list of inputs")
    inputs = tuple(read_input(d, f"inputs[{i}]", lines) for i, d in enumerate(inputs_raw))
    state_dir = s.string("state_dir", _TOP_DEFAULTS.state_dir)
    if not state_dir:
        raise lines.error("state_dir", "must not be empty")
    problem = state_dir_problem(os.path.expanduser(state_dir))
    if problem is not None:
        raise lines.error("state_dir", problem)
    lv = s.data.get("log_level")
    if isinstance(lv, str) and lv.strip().lower() in ("warn", "warning", "debug", "info", "error"):
        s.data["log_level"] = "warning" if lv.strip().lower() == "warn" else lv.strip().lower()
    level = s.string("log_level", _TOP_DEFAULTS.log_level, ("debug", "info", "warning", "error"))
    output = _output(s.raw("output"), lines, env)
    if output.data_stream is not None:
        for i, inp in enumerate(inputs):
            if inp.index is not None and "%" in inp.index:
                # every new name would become a new data stream (one a day with %Y.%m.%d)
                raise lines.error(f"inputs[{i}].index", "with output.elasticsearch.data_stream an input's index "
                                                        "names a data stream: no strftime (%) in it")
    q = _Section(s.raw("queue"), "queue", lines)
    queue = QueueConfig(max_bytes=q.size("max_bytes", _QUEUE_DEFAULTS.max_bytes, minimum=64 * 1024),
                        spool=q.string("spool", _QUEUE_DEFAULTS.spool, ("when_behind", "always")),
                        spill_after_s=q.duration("spill_after", _QUEUE_DEFAULTS.spill_after_s, positive=True))
    q.finish()
    r = _Section(s.raw("retry"), "retry", lines)
    retry = RetryConfig(
        initial_backoff_s=r.duration("initial_backoff", _RETRY_DEFAULTS.initial_backoff_s, positive=True),
        max_backoff_s=r.duration("max_backoff", _RETRY_DEFAULTS.max_backoff_s, positive=True))
    if retry.max_backoff_s < retry.initial_backoff_s:
        raise lines.error("retry.max_backoff", "must not be below retry.initial_backoff")
    r.finish()
    m = _Section(s.raw("metrics"), "metrics", lines)
    # an explicit null (or an empty ${VAR}) turns metrics off
    listen = None if m.has("listen") and m.raw("listen") is None else m.string("listen", _METRICS_DEFAULTS.listen)
    if not listen:
        listen = None
    if listen is not None and not re.match(r"^(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]*):\d{1,5}$", listen):
        raise lines.error("metrics.listen",
                          f"expected HOST:PORT (an IPv6 address in brackets: [::1]:9607), got {listen!r}")
    health_down_after_s = m.duration("health_down_after", _METRICS_DEFAULTS.health_down_after_s)
    serve_status = m.boolean("status", _METRICS_DEFAULTS.status)
    m.finish()
    cfg = Config(
        state_dir=os.path.expanduser(state_dir),
        log_level=level,
        shutdown_timeout_s=s.duration("shutdown_timeout", _TOP_DEFAULTS.shutdown_timeout_s),
        inputs=inputs,
        output=output,
        queue=queue,
        retry=retry,
        metrics=MetricsConfig(listen=listen, health_down_after_s=health_down_after_s, status=serve_status),
        max_open_files=s.integer("max_open_files", _TOP_DEFAULTS.max_open_files),
        clean_removed_after_s=s.duration("clean_removed_after", _TOP_DEFAULTS.clean_removed_after_s, positive=True),
        source=file,
        key_lines=dict(lines.lines),
    )
    s.finish()
    return cfg


def insecure_config_problem(st: os.stat_result) -> str | None:
    """Why root must not load a config file of this mode (users other than its owner may write it:
    they would choose what root reads and where it writes), or None."""
    if os.geteuid() == 0 and st.st_mode & 0o022:
        return (f"is writable by users other than its owner (mode {stat.S_IMODE(st.st_mode):04o}): "
                "root does not load it; `chmod go-w` it, or pass --allow-insecure-config")
    return None


def load_config(path: str, env: Mapping[str, str] | None = None, *, allow_insecure: bool = False) -> Config:
    """The config file at `path`, loaded. Run as root, a file other users may write is refused
    (SPEC, Trust boundaries) unless `allow_insecure`. Raises ConfigError (exit 2)."""
    try:
        with open(path, encoding="utf-8") as f:
            problem = insecure_config_problem(os.fstat(f.fileno()))     # the file read, not a path looked at
            if problem is not None and not allow_insecure:
                raise ConfigError("-c", f"config file {path} {problem}")
            text = f.read()
    except FileNotFoundError:
        raise ConfigError("-c", f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("-c", f"cannot read config file {path}: {e}") from None
    return load_config_text(text, path, env)
