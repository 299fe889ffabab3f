"""`shipper-setup TOKEN GLOB...`: bootstrap a host (config, state dir, service user, init job,
start): argv, the flow and the summary. The texts are setup_render.py's, the acts setup_install.py's,
the host (real or dry-run) setup_host.py's; a re-run with the same arguments changes nothing."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from shipper.commands.setup_host import CommandResult, DryRunHost, Host, ServiceUser, SystemHost
from shipper.commands.setup_install import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    Report,
    SetupError,
    SetupOptions,
    UninstallOptions,
    UsageError,
    install,
    uninstall,
)
from shipper.commands.setup_render import (
    DEFAULT_EXECUTABLE,
    DEFAULT_STATE_DIR,
    SYSTEMD_UNIT_PATH,
    UPSTART_JOB_PATH,
    InitSystem,
    detect_init,
    find_executable,
    mask_token,
    render_config,
    render_systemd_unit,
    render_upstart_job,
)
from shipper.config import DEFAULT_CONFIG_PATH, LOGSENE_RECEIVER, LOGSENE_RECEIVER_EU

# Paths end up in unit files and exec lines unquoted: no spaces, quotes, `$` or systemd's `%`.
_SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+:,=-]*$")
# An Elasticsearch index name that strftime leaves alone (a Logsene token is a lowercase UUID).
_TOKEN_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,254}$")
_GLOB_CHARS = set("*?[")
# A systemd unit name (systemd.unit(5)): letters, digits, ":-_.\\" and "@" for templates
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]{1,255}$")

# what callers (and the tests) import from here; the rest lives in setup_host/setup_install/setup_render
__all__ = ["DEFAULT_EXECUTABLE", "DEFAULT_STATE_DIR", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CommandResult",
           "DryRunHost", "Host", "ServiceUser", "SetupError", "SetupOptions", "SystemHost", "UninstallOptions",
           "UsageError", "build_parser", "detect_init", "find_executable", "install", "main", "parse_options",
           "render_config", "render_systemd_unit", "render_upstart_job", "uninstall"]


# ---------------------------------------------------------------- options

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
    from shipper.ship.client import redact_url  # a receiver's user:password@ is never printed
    print(f"  config:    {opts.config_path} (index {mask_token(opts.token)}, receiver {redact_url(opts.receiver)})")
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
