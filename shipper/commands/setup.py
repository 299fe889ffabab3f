"""`shipper-setup TOKEN GLOB...`: bootstrap a host: config, state dir, service user, init job, start.

The texts (config, systemd unit, Upstart job) are rendered by pure functions; `install` and
`uninstall` compare them with what is on disk and act only on differences, so a re-run with the
same arguments changes nothing. Commands and ownership go through a `Host`: `SystemHost` runs
them, `DryRunHost` (for --root, i.e. images and tests) only records them.

Ownership of the config: SPEC fixes mode 0600. The daemon runs as the unprivileged user
`shipper`, so the file is owned by shipper:shipper (root reads it anyway). A 0640 root:shipper
file would also work but is not what SPEC says; the unit's ProtectSystem=strict keeps the daemon
from writing its own config despite owning it.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, Sequence

import yaml

from shipper.config import DEFAULT_CONFIG_PATH, LOGSENE_RECEIVER, LOGSENE_RECEIVER_EU, load_config_text
from shipper.errors import ConfigError

InitSystem = Literal["systemd", "upstart", "none"]

SERVICE_NAME = "shipper"
SERVICE_USER = "shipper"
LOG_READER_GROUP = "adm"  # owns most of /var/log on Debian and Ubuntu
JOURNAL_READER_GROUP = "systemd-journal"  # may read the whole system journal (journald inputs)
DEFAULT_STATE_DIR = "/var/lib/shipper"
DEFAULT_EXECUTABLE = "/usr/local/bin/shipper"
DEFAULT_GLOBS = ("/var/log/**/*.log",)
SYSTEMD_UNIT_PATH = "/etc/systemd/system/shipper.service"
SYSTEMD_WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/shipper.service"
UPSTART_JOB_PATH = "/etc/init/shipper.conf"
METRICS_LISTEN = "127.0.0.1:9607"
CONFIG_MODE = 0o600
STATE_DIR_MODE = 0o750
UNIT_MODE = 0o644

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

# Paths end up in unit files and exec lines unquoted: no spaces, quotes, `$` or systemd's `%`.
_SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+:,=-]*$")
# An Elasticsearch index name that strftime leaves alone (a Logsene token is a lowercase UUID).
_TOKEN_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,254}$")
_GLOB_CHARS = set("*?[")
# A systemd unit name (systemd.unit(5)): letters, digits, ":-_.\\" and "@" for templates
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]{1,255}$")
# The unit's sandbox hides these trees; inputs or state there need a looser setting.
_HOME_TREES = ("/home/", "/root/", "/run/user/")
_TMP_TREES = ("/tmp/", "/var/tmp/")


class UsageError(Exception):
    """Bad arguments: exit 2."""


class SetupError(Exception):
    """The host could not be set up as asked: exit 1."""


# ---------------------------------------------------------------- pure rendering

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
        "# Written by shipper-setup. The example config shipped with shipper (config/shipper.yaml)",
        "# describes every key. To replace this file, run shipper-setup again with --force.",
        f"state_dir: {_yaml_str(state_dir)}",
        "inputs:",
        *inputs,
        "output:",
        "  elasticsearch:",
        f"    hosts: [{_yaml_str(receiver)}]",
        f"    index: {_yaml_str(token)}",
        "metrics:",
        f"  listen: {_yaml_str(METRICS_LISTEN)}",
    ]
    return "\n".join(lines) + "\n"


def _under(path: str, trees: tuple[str, ...]) -> bool:
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
    protect_home = "read-only" if any(_under(p, _HOME_TREES) for p in paths) else "true"
    private_tmp = "false" if any(_under(p, _TMP_TREES) for p in paths) else "true"
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
# Exit 2 is an invalid config: restarting cannot fix it.
RestartPreventExitStatus=2
WatchdogSec=60
# SIGTERM to the daemon first (it flushes within shutdown_timeout and checkpoints), SIGKILL
# to whatever is left after 30 s.
TimeoutStopSec=30
KillMode=mixed
User={SERVICE_USER}
Group={SERVICE_USER}
SupplementaryGroups={groups}
LimitNOFILE=65536
# Sandbox: everything read-only but the state dir, no capabilities, no raw sockets.
ProtectSystem=strict
ReadWritePaths={state_dir}
ProtectHome={protect_home}
NoNewPrivileges=true
PrivateTmp={private_tmp}
CapabilityBoundingSet=
ProtectKernelTunables=true
ProtectControlGroups=true
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6

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
# Exit 2 is an invalid config: respawning cannot fix it.
normal exit 0 2
setuid {SERVICE_USER}
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


def find_executable() -> str:
    """The `shipper` console script installed beside this one, for ExecStart."""
    candidate = Path(sysconfig.get_path("scripts")) / "shipper"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("shipper") or DEFAULT_EXECUTABLE


# ---------------------------------------------------------------- the host

@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    output: str


@dataclass(frozen=True, slots=True)
class ServiceUser:
    uid: int
    gid: int
    groups: frozenset[str]


class Host(Protocol):
    """Where commands run and users live. `is_dry_run` hosts record instead of acting."""

    is_dry_run: bool
    planned: list[str]

    def run(self, argv: Sequence[str]) -> CommandResult: ...

    def lookup_user(self, name: str) -> ServiceUser | None: ...

    def systemd_is_running(self) -> bool: ...


class SystemHost:
    """The machine we run on: commands really run."""

    is_dry_run = False

    def __init__(self) -> None:
        self.planned: list[str] = []

    def run(self, argv: Sequence[str]) -> CommandResult:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
        except FileNotFoundError:
            return CommandResult(127, f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(124, f"{shlex.join(argv)}: timed out after 120 s")
        return CommandResult(done.returncode, (done.stdout + done.stderr).strip())

    def lookup_user(self, name: str) -> ServiceUser | None:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            return None
        groups = {g.gr_name for g in grp.getgrall() if name in g.gr_mem}
        try:
            groups.add(grp.getgrgid(pw.pw_gid).gr_name)
        except KeyError:
            pass
        return ServiceUser(pw.pw_uid, pw.pw_gid, frozenset(groups))

    def systemd_is_running(self) -> bool:
        return Path("/run/systemd/system").is_dir()


class DryRunHost:
    """--root: files are written under the prefix, but no command runs and no user is created."""

    is_dry_run = True

    def __init__(self) -> None:
        self.planned: list[str] = []

    def run(self, argv: Sequence[str]) -> CommandResult:
        self.planned.append(shlex.join(argv))
        return CommandResult(0, "")

    def lookup_user(self, name: str) -> ServiceUser | None:
        return None

    def systemd_is_running(self) -> bool:
        return False


# ---------------------------------------------------------------- options

@dataclass(frozen=True, slots=True)
class SetupOptions:
    token: str
    globs: tuple[str, ...]
    receiver: str
    config_path: str
    state_dir: str
    init: InitSystem
    should_start: bool
    is_forced: bool
    executable: str
    journald_units: tuple[str, ...] | None = None   # set: a journald input for these units (() = all)


@dataclass(frozen=True, slots=True)
class UninstallOptions:
    config_path: str
    state_dir: str | None  # None: the one named in the config, else the default
    should_purge: bool


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shipper-setup",
        description="Bootstrap this host: write the shipper config, create the state dir and the "
                    "service user, install and start the service.",
        epilog="example: sudo shipper-setup YOUR-LOGSENE-TOKEN '/var/log/**/*.log'",
    )
    p.add_argument("token", nargs="?", metavar="TOKEN", help="Logsene app token (used as the index name)")
    p.add_argument("globs", nargs="*", metavar="GLOB", help="absolute globs of files to ship; quote them")
    p.add_argument("--journald", nargs="*", metavar="UNIT",
                   help="also ship the systemd journal: entries of these units (none named: every entry); "
                        "put it after TOKEN and the GLOBs")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--receiver", metavar="URL", help=f"Elasticsearch-compatible URL (default {LOGSENE_RECEIVER})")
    where.add_argument("--region", choices=("us", "eu"), help="pick the Logsene receiver of this region (default us)")
    p.add_argument("--config", metavar="PATH", default=DEFAULT_CONFIG_PATH, help=f"default {DEFAULT_CONFIG_PATH}")
    p.add_argument("--state-dir", metavar="PATH", help=f"default {DEFAULT_STATE_DIR}")
    p.add_argument("--init", choices=("systemd", "upstart", "none", "auto"), default="auto",
                   help="service manager to install for (default auto: systemd, else upstart, else none)")
    p.add_argument("--no-start", action="store_true", help="install (and enable at boot) but do not start now")
    p.add_argument("--root", metavar="DIR", help="write everything under DIR (for images and tests); run nothing")
    p.add_argument("--force", action="store_true", help="replace a different existing config (kept as CONFIG.bak)")
    p.add_argument("--uninstall", action="store_true", help="stop and disable the service, remove its unit or job")
    p.add_argument("--purge", action="store_true", help="with --uninstall: also remove the config and the state dir")
    return p


def _check_path(value: str, flag: str) -> str:
    if not os.path.isabs(value):
        raise UsageError(f"{flag} must be an absolute path, got {value!r}")
    value = os.path.normpath(value)
    if not _SAFE_PATH_RE.match(value):
        raise UsageError(f"{flag} {value!r}: use only letters, digits and . _ / @ + : , = - in paths")
    return value


def parse_options(args: argparse.Namespace, root: Path | None) -> SetupOptions | UninstallOptions:
    config_path = _check_path(args.config, "--config")
    state_dir = _check_path(args.state_dir, "--state-dir") if args.state_dir else None
    if args.purge and not args.uninstall:
        raise UsageError("--purge only goes with --uninstall")
    if args.uninstall:
        if args.token or args.globs or args.journald is not None:
            raise UsageError("--uninstall takes no TOKEN, GLOB or --journald")
        return UninstallOptions(config_path, state_dir, args.purge)

    journald = None if args.journald is None else tuple(dict.fromkeys(args.journald))
    if not args.token:
        raise UsageError("TOKEN and at least one GLOB (or --journald) are required")
    if not args.globs and journald is None:
        raise UsageError("at least one GLOB (or --journald UNIT...) is required, e.g. '/var/log/**/*.log' (quoted)")
    for u in journald or ():
        if not _UNIT_RE.match(u):
            raise UsageError(f"--journald {u!r} is not a systemd unit name (e.g. app.service)")
    if not _TOKEN_RE.match(args.token):
        raise UsageError(f"TOKEN ({mask_token(args.token)}) must be an index name: lowercase letters, "
                         "digits, '.', '_' and '-'")
    for g in args.globs:
        if not g.startswith("/"):
            raise UsageError(f"GLOB {g!r} must be an absolute path, e.g. '/var/log/**/*.log'")
        if any(c in g for c in "\n\r\0"):
            raise UsageError(f"GLOB {g!r} contains a control character")
    receiver = (args.receiver or (LOGSENE_RECEIVER_EU if args.region == "eu" else LOGSENE_RECEIVER)).rstrip("/")
    init: InitSystem = detect_init(root) if args.init == "auto" else args.init
    executable = find_executable()
    if init != "none" and not _SAFE_PATH_RE.match(executable):
        raise SetupError(f"the shipper executable {executable!r} has characters a unit file cannot hold; "
                         "reinstall shipper under a plain path such as /usr/local")
    return SetupOptions(
        token=args.token,
        globs=tuple(dict.fromkeys(args.globs)),
        receiver=receiver,
        config_path=config_path,
        state_dir=state_dir or DEFAULT_STATE_DIR,
        init=init,
        should_start=not args.no_start,
        is_forced=args.force,
        executable=executable,
        journald_units=journald,
    )


# ---------------------------------------------------------------- doing it

@dataclass
class Report:
    """What happened, for the summary. `changes` empty means the run changed nothing."""

    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _on_disk(prefix: Path, real_path: str) -> Path:
    return prefix / real_path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _write_atomically(path: Path, data: bytes, mode: int, owner: ServiceUser | None) -> None:
    """Write via a temp file and rename: a crash leaves the old file or the new one, never half.

    The temp file is created with `mode` (never wider, whatever the umask) and chowned before the
    rename, so the secret-bearing config is never readable by others, not even for an instant.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, owner.uid, owner.gid)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _ensure_dir(path: Path, mode: int, report: Report, what: str) -> None:
    if not path.is_dir():
        path.mkdir(parents=True, mode=mode)
        os.chmod(path, mode)
        report.changes.append(f"created {what}")


def _ensure_owner(path: Path, owner: ServiceUser | None, report: Report, what: str) -> None:
    if owner is None:
        return
    st = path.stat()
    if (st.st_uid, st.st_gid) != (owner.uid, owner.gid):
        os.chown(path, owner.uid, owner.gid)
        report.changes.append(f"gave {what} to {SERVICE_USER}")


def _must(host: Host, argv: Sequence[str], what: str) -> CommandResult:
    result = host.run(argv)
    if result.returncode != 0:
        detail = f": {result.output}" if result.output else ""
        raise SetupError(f"{what} failed ({shlex.join(argv)}, exit {result.returncode}){detail}")
    return result


def _ensure_service_user(host: Host, state_dir: str, report: Report,
                         is_journald: bool = False) -> ServiceUser | None:
    """The service user, in the group that reads /var/log (and, for journald inputs, the one that
    reads the system journal: the unit grants it too, this is for `shipper check` run as the user)."""
    wanted = [LOG_READER_GROUP] + ([JOURNAL_READER_GROUP] if is_journald else [])
    user = host.lookup_user(SERVICE_USER)
    if user is None:
        argv = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", state_dir,
                "--shell", "/usr/sbin/nologin", "--comment", "shipper log shipper"]
        groups = [g for g in wanted if host.is_dry_run or host.run(["getent", "group", g]).returncode == 0]
        if groups:
            argv += ["--groups", ",".join(groups)]
        if LOG_READER_GROUP not in groups:
            report.notes.append(f"group {LOG_READER_GROUP} does not exist: {SERVICE_USER} reads only "
                                "world-readable logs")
        if is_journald and JOURNAL_READER_GROUP not in groups:
            report.notes.append(f"group {JOURNAL_READER_GROUP} does not exist: is this a systemd host?")
        _must(host, [*argv, SERVICE_USER], f"creating the {SERVICE_USER} user")
        if host.is_dry_run:
            return None
        report.changes.append(f"created system user {SERVICE_USER} (groups: {', '.join(groups) or 'none'})")
        user = host.lookup_user(SERVICE_USER)
        if user is None:
            raise SetupError(f"useradd succeeded but user {SERVICE_USER} is still unknown")
    else:
        for g in wanted:
            if g not in user.groups and host.run(["getent", "group", g]).returncode == 0:
                _must(host, ["usermod", "--append", "--groups", g, SERVICE_USER], f"adding {SERVICE_USER} to {g}")
                report.changes.append(f"added {SERVICE_USER} to group {g}")
    return user


def install(opts: SetupOptions, host: Host, prefix: Path) -> tuple[int, Report]:
    """Bring the host to the state `opts` describe. Raises UsageError / SetupError."""
    report = Report()
    text = render_config(opts.token, opts.globs, opts.receiver, opts.state_dir, opts.journald_units)
    try:
        # env={}: the written file is exactly what the service reads, whatever our environment.
        # No file name: nothing is written yet, so a line number would point at nothing.
        cfg = load_config_text(text, None, env={})
    except ConfigError as e:
        raise UsageError(f"the config these arguments make is invalid: {e.key}: {e.message}") from None
    globs = tuple(g for inp in cfg.inputs for g in inp.paths)
    units = next((inp.journald.units for inp in cfg.inputs if inp.journald is not None), None)
    if (cfg.output.index, cfg.output.hosts, globs, units) != (opts.token, (opts.receiver,), opts.globs,
                                                              opts.journald_units):
        raise UsageError("the arguments do not survive a round trip through the config loader")

    config_file = _on_disk(prefix, opts.config_path)
    backup_file = config_file.with_name(config_file.name + ".bak")
    existing = _read(config_file)
    if existing is not None and existing != text and not opts.is_forced:
        raise SetupError(f"{opts.config_path} already exists with a different configuration; "
                         f"re-run with --force to replace it (the old one is kept as {opts.config_path}.bak)")

    user = _ensure_service_user(host, opts.state_dir, report, opts.journald_units is not None)

    _ensure_dir(config_file.parent, 0o755, report, f"{os.path.dirname(opts.config_path)}/")
    config_changed = existing != text
    if existing is not None and config_changed:
        _write_atomically(backup_file, existing.encode("utf-8"), CONFIG_MODE, user)
        report.changes.append(f"kept the previous config as {opts.config_path}.bak (mode 0600)")
    if config_changed:
        _write_atomically(config_file, text.encode("utf-8"), CONFIG_MODE, user)
        report.changes.append(f"wrote {opts.config_path} (mode 0600)")
    elif (config_file.stat().st_mode & 0o777) != CONFIG_MODE:
        os.chmod(config_file, CONFIG_MODE)
        report.changes.append(f"set {opts.config_path} to mode 0600")
    _ensure_owner(config_file, user, report, opts.config_path)

    state_dir = _on_disk(prefix, opts.state_dir)
    _ensure_dir(state_dir, STATE_DIR_MODE, report, f"state dir {opts.state_dir} (mode 0750)")
    _ensure_owner(state_dir, user, report, opts.state_dir)
    if host.is_dry_run:
        host.planned.append(f"chown {SERVICE_USER}:{SERVICE_USER} {opts.config_path} {opts.state_dir}")

    unit_changed = False
    if opts.init == "systemd":
        unit_changed = _install_file(prefix, SYSTEMD_UNIT_PATH, render_systemd_unit(
            opts.executable, opts.config_path, opts.state_dir, opts.globs, opts.journald_units is not None), report)
    elif opts.init == "upstart":
        unit_changed = _install_file(prefix, UPSTART_JOB_PATH, render_upstart_job(
            opts.executable, opts.config_path), report)
    if opts.init == "systemd" and _under(opts.executable, _HOME_TREES):
        report.notes.append(f"warning: {opts.executable} is under a home directory, which the unit's "
                            "ProtectHome hides; install shipper system-wide (pip install outside ~)")

    started = _start_service(opts, host, report, config_changed or unit_changed, unit_changed)
    if started:
        _run_check(opts, host, user)
    return EXIT_OK, report


def _install_file(prefix: Path, real_path: str, text: str, report: Report) -> bool:
    path = _on_disk(prefix, real_path)
    if _read(path) == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, text.encode("utf-8"), UNIT_MODE, None)
    report.changes.append(f"installed {real_path}")
    return True


def _start_service(opts: SetupOptions, host: Host, report: Report, is_changed: bool, unit_changed: bool) -> bool:
    """Enable and (re)start per the init system. True when the service runs as a result."""
    unit = f"{SERVICE_NAME}.service"
    if opts.init == "systemd":
        if host.is_dry_run:
            host.run(["systemctl", "daemon-reload"])
            host.run(["systemctl", "enable", "--now", unit] if opts.should_start else ["systemctl", "enable", unit])
            return False
        if not host.systemd_is_running():
            report.notes.append("systemd is not running here: the unit is installed but nothing was started")
            return False
        if unit_changed:
            _must(host, ["systemctl", "daemon-reload"], "reloading systemd")
        is_enabled = host.run(["systemctl", "is-enabled", "--quiet", unit]).returncode == 0
        is_active = host.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0
        if not opts.should_start:
            if not is_enabled:
                _must(host, ["systemctl", "enable", unit], "enabling the service")
                report.changes.append("enabled shipper.service (starts at boot; not started now: --no-start)")
            return False
        if is_active and is_changed:
            _must(host, ["systemctl", "restart", unit], "restarting the service")
            report.changes.append("restarted shipper.service")
        if not (is_enabled and is_active):
            _must(host, ["systemctl", "enable", "--now", unit], "starting the service")
            report.changes.append("enabled and started shipper.service")
        return True
    if opts.init == "upstart":
        if host.is_dry_run:
            if opts.should_start:
                host.run(["initctl", "start", SERVICE_NAME])
            return False
        host.run(["initctl", "reload-configuration"])
        if not opts.should_start:
            return False
        status = host.run(["initctl", "status", SERVICE_NAME])
        is_running = status.returncode == 0 and "start/running" in status.output
        if is_running and is_changed:
            _must(host, ["initctl", "restart", SERVICE_NAME], "restarting the job")
            report.changes.append("restarted the shipper job")
        elif not is_running:
            _must(host, ["initctl", "start", SERVICE_NAME], "starting the job")
            report.changes.append("started the shipper job")
        return True
    return False


def _run_check(opts: SetupOptions, host: Host, user: ServiceUser | None) -> None:
    """`shipper check` as the service user, so it sees the files the daemon will see. Advisory only."""
    argv = [opts.executable, "check", "-c", opts.config_path]
    if user is not None and shutil.which("runuser"):
        argv = ["runuser", "-u", SERVICE_USER, "--", *argv]
    result = host.run(argv)
    print(f"$ {shlex.join(argv)}")
    if result.output:
        output = result.output.replace(opts.token, mask_token(opts.token))  # it may name the index
        print("\n".join("  " + line for line in output.splitlines()))
    if result.returncode != 0:
        print(f"shipper check reported a problem (exit {result.returncode}); the service keeps retrying. "
              "Fix the cause, then look at `shipper status`.")


def _remove(path: Path, real_path: str, report: Report) -> bool:
    if path.is_symlink() or path.exists():
        path.unlink()
        report.changes.append(f"removed {real_path}")
        return True
    return False


def uninstall(opts: UninstallOptions, host: Host, prefix: Path) -> tuple[int, Report]:
    """Stop and disable the service, remove its unit or job; with --purge the config and state too."""
    report = Report()
    unit = f"{SERVICE_NAME}.service"
    unit_file = _on_disk(prefix, SYSTEMD_UNIT_PATH)
    if unit_file.exists():
        if host.is_dry_run or host.systemd_is_running():
            result = host.run(["systemctl", "disable", "--now", unit])
            if result.returncode != 0:
                report.notes.append(f"systemctl disable --now {unit} failed: {result.output}")
        _remove(unit_file, SYSTEMD_UNIT_PATH, report)
        _remove(_on_disk(prefix, SYSTEMD_WANTS_LINK), SYSTEMD_WANTS_LINK, report)
        if host.is_dry_run or host.systemd_is_running():
            host.run(["systemctl", "daemon-reload"])
            host.run(["systemctl", "reset-failed", unit])
    job_file = _on_disk(prefix, UPSTART_JOB_PATH)
    if job_file.exists():
        host.run(["initctl", "stop", SERVICE_NAME])  # fails harmlessly when the job is not running
        _remove(job_file, UPSTART_JOB_PATH, report)

    config_file = _on_disk(prefix, opts.config_path)
    state_real = opts.state_dir or _state_dir_of(config_file) or DEFAULT_STATE_DIR
    state_dir = _on_disk(prefix, state_real)
    if opts.should_purge:
        _remove(config_file, opts.config_path, report)
        _remove(config_file.with_name(config_file.name + ".bak"), opts.config_path + ".bak", report)
        if config_file.parent.is_dir() and not any(config_file.parent.iterdir()):
            config_file.parent.rmdir()
        if state_dir.is_dir():
            if len(Path(state_real).parts) < 3:
                raise SetupError(f"refusing to delete {state_real}: it does not look like a state dir")
            shutil.rmtree(state_dir)
            report.changes.append(f"removed {state_real}")
        report.notes.append(f"user {SERVICE_USER} was kept; remove it with: userdel {SERVICE_USER}")
    else:
        kept = [p for p, f in ((opts.config_path, config_file), (state_real, state_dir)) if f.exists()]
        if kept:
            report.notes.append(f"kept {' and '.join(kept)} (remove them with --uninstall --purge)")
    return EXIT_OK, report


def _state_dir_of(config_file: Path) -> str | None:
    """The state_dir a config names, read without validation: uninstall must work on a broken config."""
    try:
        data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    value = data.get("state_dir") if isinstance(data, dict) else None
    return os.path.normpath(value) if isinstance(value, str) and value.startswith("/") and "$" not in value else None


# ---------------------------------------------------------------- output

def _print_changes(report: Report, done: str, nothing: str) -> None:
    if report.changes:
        print(f"shipper-setup: {done}")
        for change in report.changes:
            print(f"  - {change}")
    else:
        print(f"shipper-setup: {nothing}")


def _print_install_summary(opts: SetupOptions, report: Report, host: Host, root: Path | None) -> None:
    _print_changes(report, "done.", "nothing changed; this host is already set up as asked.")
    print(f"  config:    {opts.config_path} (index {mask_token(opts.token)}, receiver {opts.receiver})")
    if opts.globs:
        print(f"  inputs:    {', '.join(opts.globs)}")
    if opts.journald_units is not None:
        print(f"  journald:  {', '.join(opts.journald_units) or 'every unit'} (the system journal)")
    print(f"  state dir: {opts.state_dir}")
    if opts.init == "systemd":
        print(f"  service:   {SYSTEMD_UNIT_PATH}")
    elif opts.init == "upstart":
        print(f"  service:   {UPSTART_JOB_PATH} (Upstart)")
    for note in report.notes:
        print(f"  note: {note}")
    if root is not None:
        print(f"Under --root {root} nothing is run and no user is created; "
              "on the target host this setup also needs:")
        for cmd in host.planned:
            print(f"  {cmd}")
    if opts.init == "none":
        print("No service manager was chosen. Run shipper under yours, as user shipper:")
        print(f"  {opts.executable} run -c {opts.config_path}")
    elif not opts.should_start and root is None:
        start = "systemctl start shipper" if opts.init == "systemd" else "initctl start shipper"
        print(f"Not started (--no-start). Start it with: {start}")
    print(f"Status: shipper status -c {opts.config_path}")
    if opts.init == "upstart":
        print("Logs:   /var/log/upstart/shipper.log")
    else:
        print("Logs:   journalctl -u shipper -f" if opts.init == "systemd" else "Logs:   the daemon's stderr")
    print("Undo:   shipper-setup --uninstall")


def _print_uninstall_summary(report: Report, host: Host, root: Path | None) -> None:
    _print_changes(report, "uninstalled.", "no shipper service is installed here; nothing changed.")
    for note in report.notes:
        print(f"  note: {note}")
    if root is not None and host.planned:
        print(f"Under --root {root} nothing is run; on the target host this also needs:")
        for cmd in host.planned:
            print(f"  {cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_intermixed_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage, 0 for --help; callers want a code
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    root = Path(os.path.abspath(args.root)) if args.root else None
    try:
        opts = parse_options(args, root)
        if root is None and os.geteuid() != 0:
            raise SetupError("shipper-setup changes the system: run it as root (sudo), or use --root DIR")
        host: Host = DryRunHost() if root is not None else SystemHost()
        prefix = root or Path("/")
        if isinstance(opts, UninstallOptions):
            code, report = uninstall(opts, host, prefix)
            _print_uninstall_summary(report, host, root)
            return code
        unexpanded = [g for g in opts.globs if not _GLOB_CHARS & set(g)]
        if opts.journald_units is not None and opts.init == "upstart":
            print("note: --journald reads the systemd journal; an Upstart host has none", file=sys.stderr)
        if len(unexpanded) > 1:
            print("note: several GLOBs without wildcards: did the shell expand a glob? Quote it: "
                  "'/var/log/**/*.log'", file=sys.stderr)
        code, report = install(opts, host, prefix)
        _print_install_summary(opts, report, host, root)
        return code
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"shipper-setup: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SetupError as e:
        print(f"shipper-setup: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as e:
        print(f"shipper-setup: {e}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
