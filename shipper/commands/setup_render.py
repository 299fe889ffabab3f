"""The texts shipper-setup installs, rendered by pure functions: the config, the systemd unit,
the Upstart job; plus where they go and which init system and executable to name in them.

The defaults the config names (state dir, metrics address) are `shipper.config`'s own.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from shipper.config import DEFAULT_METRICS_LISTEN
from shipper.config import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR

InitSystem = Literal["systemd", "upstart", "none"]

SERVICE_NAME = "shipper"
SERVICE_USER = "shipper"
LOG_READER_GROUP = "adm"  # owns most of /var/log on Debian and Ubuntu
JOURNAL_READER_GROUP = "systemd-journal"  # may read the whole system journal (journald inputs)
DEFAULT_EXECUTABLE = "/usr/local/bin/shipper"
DEFAULT_GLOBS = ("/var/log/**/*.log",)
SYSTEMD_UNIT_PATH = "/etc/systemd/system/shipper.service"
SYSTEMD_WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/shipper.service"
UPSTART_JOB_PATH = "/etc/init/shipper.conf"

# The unit's sandbox hides these trees; inputs or state there need a looser setting.
HOME_TREES = ("/home/", "/root/", "/run/user/")
TMP_TREES = ("/tmp/", "/var/tmp/")


def mask_token(token: str) -> str:
    """What the summary shows of the token: its first four characters."""
    return token[:4] + "…"


def _yaml_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def render_config(token: str, globs: Sequence[str], receiver: str, state_dir: str,
                  journald_units: Sequence[str] | None = None) -> str:
    """The YAML that shipper-setup writes. No timestamp, so a re-run renders the same bytes.
    `journald_units`: also a journald input (the system journal) for these units ([]: all)."""
    inputs: list[str] = []
    if globs:
        inputs += ["  - paths:", *(f"      - {_yaml_str(g)}" for g in globs), "    exclude: ['*.gz']"]
    if journald_units is not None:
        units = ", ".join(_yaml_str(u) for u in journald_units)
        inputs += ["  - journald:", f"      units: [{units}]"]
    lines = [
        "# Written by shipper-setup. Every key is described in the manual's configuration reference",
        "# (docs/configuration.md in shipper's source; config/shipper.yaml there is the same as a file).",
        "# To replace this file, run shipper-setup again with --force.",
        f"state_dir: {_yaml_str(state_dir)}",
        "inputs:",
        *inputs,
        "output:",
        "  elasticsearch:",
        f"    hosts: [{_yaml_str(receiver)}]",
        f"    index: {_yaml_str(token)}",
        "metrics:",
        f"  listen: {_yaml_str(DEFAULT_METRICS_LISTEN)}",
    ]
    return "\n".join(lines) + "\n"


def is_under(path: str, trees: tuple[str, ...]) -> bool:
    return any((path.rstrip("/") + "/").startswith(t) for t in trees)


def render_systemd_unit(executable: str, config_path: str, state_dir: str,
                        globs: Sequence[str] = DEFAULT_GLOBS, is_journald: bool = False) -> str:
    """The unit file. systemd/shipper.service in the repo is this with the defaults.

    ProtectHome and PrivateTmp would hide inputs under /home or /tmp without any error, so they
    are loosened when a glob (or the state dir) lives there. `is_journald`: the config reads the
    system journal, so the service also gets the group that may read all of it.
    """
    paths = [*globs, state_dir]
    groups = f"{LOG_READER_GROUP} {JOURNAL_READER_GROUP}" if is_journald else LOG_READER_GROUP
    protect_home = "read-only" if any(is_under(p, HOME_TREES) for p in paths) else "true"
    private_tmp = "false" if any(is_under(p, TMP_TREES) for p in paths) else "true"
    return f"""\
# shipper: ships log files to Elasticsearch. Installed by shipper-setup, which rewrites this
# file: put local changes in a drop-in (`systemctl edit shipper`), they survive a re-run.
[Unit]
Description=shipper log shipper (files -> Elasticsearch bulk)
Wants=network-online.target
After=network-online.target

[Service]
# READY=1 once state, output and inputs are up; WATCHDOG=1 every WatchdogSec/2.
Type=notify
NotifyAccess=main
ExecStart={executable} run -c {config_path}
# SIGHUP reloads the config without losing or duplicating events.
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=5
# Exit 2 is an invalid config, exit 3 a damaged state dir (`shipper state repair`):
# restarting cannot fix either.
RestartPreventExitStatus=2 3
WatchdogSec=60
# SIGTERM to the daemon first (it flushes within shutdown_timeout and checkpoints), SIGKILL
# to whatever is left after 30 s.
TimeoutStopSec=30
KillMode=mixed
User={SERVICE_USER}
Group={SERVICE_USER}
SupplementaryGroups={groups}
LimitNOFILE=65536
# Sandbox (`systemd-analyze security shipper` rates it OK): what shipper creates is its own
# (0600); everything read-only but the state dir; no capabilities, devices, other users'
# processes, namespaces, raw or netlink sockets. The system calls are those of a service
# (@system-service) less @privileged and @resources: reading files and the journal (the
# journalctl child), inotify, SQLite, TLS and HTTP need no more. A call
# outside the list fails with EPERM rather than killing the daemon mid-write.
UMask=0077
ProtectSystem=strict
ReadWritePaths={state_dir}
ProtectHome={protect_home}
PrivateTmp={private_tmp}
PrivateDevices=true
NoNewPrivileges=true
CapabilityBoundingSet=
AmbientCapabilities=
ProtectKernelTunables=true
ProtectKernelModules=true
ProtectKernelLogs=true
ProtectControlGroups=true
ProtectClock=true
ProtectHostname=true
ProtectProc=invisible
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=true
RestrictRealtime=true
RestrictSUIDSGID=true
LockPersonality=true
MemoryDenyWriteExecute=true
RemoveIPC=true
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""


def render_upstart_job(executable: str, config_path: str) -> str:
    """The Upstart job (/etc/init/shipper.conf). systemd/upstart/shipper.conf is this with the defaults."""
    return f"""\
# shipper: ships log files to Elasticsearch. Installed by shipper-setup (Upstart >= 1.4).
description "shipper log shipper (files -> Elasticsearch bulk)"

start on runlevel [2345]
stop on runlevel [!2345]

respawn
respawn limit 10 5
# Exit 2 is an invalid config, exit 3 a damaged state dir (`shipper state repair`):
# respawning cannot fix either.
normal exit 0 2 3
setuid {SERVICE_USER}
# What shipper creates is its own (0600), as under systemd's UMask=0077.
umask 0077
# SIGTERM, then SIGKILL after 30 s: shipper flushes within shutdown_timeout and checkpoints.
kill timeout 30
limit nofile 65536 65536
# The daemon's own JSON log lines go to /var/log/upstart/shipper.log.
console log

exec {executable} run -c {config_path}
"""


def detect_init(root: Path | None) -> InitSystem:
    """systemd if it is running (or, under --root, installed in the image), else Upstart, else none."""
    if root is None:
        if Path("/run/systemd/system").is_dir():
            return "systemd"
        if Path("/sbin/initctl").exists():
            return "upstart"
        return "none"
    if any((root / p).exists() for p in ("run/systemd/system", "lib/systemd/systemd", "usr/lib/systemd/systemd")):
        return "systemd"
    if (root / "sbin/initctl").exists():
        return "upstart"
    return "none"


def interpreter_of(executable: str) -> str | None:
    """The Python a console script runs with: its #! line's program, links resolved (a venv's
    bin/python3 is a link to the Python it was made from); None when it names none."""
    try:
        with open(executable, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="surrogateescape").split()
    return os.path.realpath(words[0]) if words else None


def find_executable() -> str:
    """The `shipper` console script installed beside this one, for ExecStart."""
    candidate = Path(sysconfig.get_path("scripts")) / "shipper"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("shipper") or DEFAULT_EXECUTABLE
