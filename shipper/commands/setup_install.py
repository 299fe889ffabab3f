"""shipper-setup's acts: bring the host to the state the options describe (`install`) or take the
service away (`uninstall`), acting only where the rendered texts differ from what is on disk.
Commands and ownership go through a `Host` (setup_host.py)."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from shipper import settings, statedir
from shipper.commands.setup_host import CommandResult, Host, ServiceUser
from shipper.commands.setup_render import (
    DEFAULT_STATE_DIR,
    HOME_TREES,
    JOURNAL_READER_GROUP,
    LOG_READER_GROUP,
    SERVICE_NAME,
    SERVICE_USER,
    SYSTEMD_UNIT_PATH,
    SYSTEMD_WANTS_LINK,
    UPSTART_JOB_PATH,
    InitSystem,
    interpreter_of,
    is_under,
    mask_token,
    render_config,
    render_systemd_unit,
    render_upstart_job,
)
from shipper.errors import ConfigError

CONFIG_MODE = 0o600
STATE_DIR_MODE = 0o700          # SPEC, Trust boundaries: a state dir shipper creates is 0700
UNIT_MODE = 0o644

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad arguments: exit 2."""


class SetupError(Exception):
    """The host could not be set up as asked: exit 1."""


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


# Ownership of the config: SPEC fixes mode 0600. The daemon runs as the unprivileged user `shipper`,
# so the file is owned by shipper:shipper (root reads it anyway). A 0640 root:shipper file would
# also work but is not what SPEC says; the unit's ProtectSystem=strict keeps the daemon from writing
# its own config despite owning it.
def install(opts: SetupOptions, host: Host, prefix: Path) -> tuple[int, Report]:
    """Bring the host to the state `opts` describe. Raises UsageError / SetupError."""
    report = Report()
    text = render_config(opts.token, opts.globs, opts.receiver, opts.state_dir, opts.journald_units)
    try:
        # env={}: the written file is exactly what the service reads, whatever our environment.
        # No file name: nothing is written yet, so a line number would point at nothing.
        cfg = settings.load_text(text, None, env={})
    except ConfigError as e:
        raise UsageError(f"the config these arguments make is invalid: {e.key}: {e.message}") from None
    globs = tuple(g for inp in cfg.inputs for g in inp.paths)
    units = next((inp.journald.units for inp in cfg.inputs if inp.journald is not None), None)
    if (cfg.output.index, cfg.output.hosts, globs, units) != (opts.token, (opts.receiver,), opts.globs,
                                                              opts.journald_units):
        raise UsageError("the arguments do not survive a round trip through the config loader")

    state_dir = _on_disk(prefix, opts.state_dir)
    _check_state_dir(opts.state_dir, state_dir)           # before anything changes
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

    _ensure_dir(state_dir, STATE_DIR_MODE, report, f"state dir {opts.state_dir} (mode 0700)")
    statedir.mark(str(state_dir))          # shipper's from now on: --purge may remove it
    _ensure_owner(state_dir, user, report, opts.state_dir)
    _ensure_owner(state_dir / statedir.MARKER, user, report, f"{opts.state_dir}/{statedir.MARKER}")
    if host.is_dry_run:
        host.planned.append(f"chown {SERVICE_USER}:{SERVICE_USER} {opts.config_path} {opts.state_dir}")

    unit_changed = False
    if opts.init == "systemd":
        unit_changed = _install_file(prefix, SYSTEMD_UNIT_PATH, render_systemd_unit(
            opts.executable, opts.config_path, opts.state_dir, opts.globs, opts.journald_units is not None), report)
    elif opts.init == "upstart":
        unit_changed = _install_file(prefix, UPSTART_JOB_PATH, render_upstart_job(
            opts.executable, opts.config_path), report)
    if opts.init == "systemd":
        if is_under(opts.executable, HOME_TREES):
            report.notes.append(f"warning: {opts.executable} is under a home directory, which the unit's "
                                "ProtectHome hides; install shipper system-wide (pip install outside ~)")
        else:
            python = interpreter_of(opts.executable)
            if python is not None and is_under(python, HOME_TREES):
                # a venv made from pyenv's, asdf's or conda's Python: bin/python3 links into a home
                report.notes.append(f"warning: {opts.executable} runs {python}, under a home directory, which "
                                    "the unit's ProtectHome hides (nor can the shipper user read it); make the "
                                    "venv from a system Python (/usr/bin/python3 -m venv /opt/shipper)")

    started = _start_service(opts, host, report, config_changed or unit_changed, unit_changed)
    if started:
        _run_check(opts, host, user)
    return EXIT_OK, report


def _check_state_dir(real: str, on_disk: Path) -> None:
    """--state-dir takes only a new directory or one shipper made (its marker inside, or only
    shipper's own files in it): never `/`, a system directory or any other that holds what is not
    shipper's (`--state-dir /var/lib` would have chowned /var/lib). Raises SetupError."""
    parent, name = os.path.split(real.rstrip("/") or "/")
    if real == "/" or (parent == "/" and name in statedir.SYSTEM_TOP_DIRS):
        raise SetupError(f"--state-dir {real} is a system directory: give shipper one of its own, "
                         "such as /var/lib/shipper")
    if on_disk.is_symlink() or (on_disk.exists() and not on_disk.is_dir()):
        raise SetupError(f"--state-dir {real} exists and is not a directory (or is a link): give shipper a new one")
    foreign = statedir.foreign_entries(str(on_disk))
    if foreign is not None:
        raise SetupError(f"--state-dir {real} is an existing directory that shipper did not make (no "
                         f"{statedir.MARKER} in it; it holds {', '.join(foreign)}): give shipper a new directory "
                         "of its own, such as /var/lib/shipper")


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
    config_file = _on_disk(prefix, opts.config_path)
    state_real = opts.state_dir or _state_dir_of(config_file) or DEFAULT_STATE_DIR
    state_dir = _on_disk(prefix, state_real)
    if opts.should_purge and state_dir.is_dir() and not state_dir.is_symlink():
        try:
            _check_state_dir(state_real, state_dir)
        except SetupError:
            raise SetupError(f"refusing to delete {state_real}: shipper did not make it (no {statedir.MARKER} "
                             "in it, and it holds files that are not shipper's); nothing was changed") from None
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

    if opts.should_purge:
        _remove(config_file, opts.config_path, report)
        _remove(config_file.with_name(config_file.name + ".bak"), opts.config_path + ".bak", report)
        if config_file.parent.is_dir() and not any(config_file.parent.iterdir()):
            config_file.parent.rmdir()
        if state_dir.is_dir() and not state_dir.is_symlink():
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
