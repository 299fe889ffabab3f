"""`shipper` command line: argv -> calls; exceptions -> exit codes (0 ok, 1 runtime failure, 2 usage/config).

Dispatches run, check, status, dlq, pipe, template and demo. Logic lives in the modules these call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from shipper import __version__, settings
from shipper.config import DEFAULT_CONFIG_PATH, Config
from shipper.errors import ConfigError, ShipperError, StateDamagedError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"shipper: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shipper", description="Ship log files to Elasticsearch: no line lost, none indexed twice.")
    p.add_argument("--version", action="version", version=f"shipper {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def with_config(sp: argparse.ArgumentParser, default: str | None = DEFAULT_CONFIG_PATH) -> None:
        sp.add_argument("-c", "--config", default=default, help=f"config file (default {default})")
        sp.add_argument("--allow-insecure-config", action="store_true",
                        help="as root, load a config file that users other than its owner may write")

    r = sub.add_parser("run", help="run the daemon in the foreground")
    with_config(r)
    c = sub.add_parser("check", help="validate config, list matched files, try the output")
    with_config(c)
    s = sub.add_parser("status", help="per-file progress, queue, dead letters, output state")
    with_config(s)
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.add_argument("--state-dir",
                   help="look at this state dir (e.g. a `shipper pipe` queue); without -c no config is needed")
    d = sub.add_parser("dlq", help="dead-letter queue: list, replay or purge")
    d.add_argument("action", choices=("list", "replay", "purge"))
    with_config(d)
    pp = sub.add_parser("pipe", help="ship stdin (node app.js | shipper pipe --url URL --index NAME)")
    with_config(pp, default=None)
    pp.add_argument("--url", help="Elasticsearch URL (required without -c)")
    pp.add_argument("--index", help="index name or pattern (required without -c)")
    pp.add_argument("--state-dir", help="queue directory (default $XDG_STATE_HOME/shipper/pipe)")
    pp.add_argument("--format", default=None, choices=("auto", "json", "text"), help="line format (default auto)")
    pp.add_argument("--timeout", default="30s", help="how long to keep retrying after stdin closes (default 30s)")
    t = sub.add_parser("template", help="print or install the index template for the configured indices")
    with_config(t)
    t.add_argument("--print", action="store_true", dest="print_only",
                   help="print the template as JSON, install nothing")
    t.add_argument("--force", action="store_true", help="replace an existing template named shipper")
    st = sub.add_parser("state", help="check the state dir (spool, checkpoints, dead letters); repair a damaged one")
    st.add_argument("action", choices=("check", "repair"))
    with_config(st)
    st.add_argument("--state-dir", help="this state dir (without -c no config is needed)")
    dm = sub.add_parser("demo", help="the whole pipeline on an embedded OpenSearch-compatible server")
    dm.add_argument("--lines", type=int, default=3000, help="sample lines to write (default 3000)")
    return p


def load(path: str) -> Config:
    return settings.load(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    insecure = settings.allow_insecure_config(bool(getattr(args, "allow_insecure_config", False)))
    # what shipper creates (the state dir's files, SQLite's among them) is its own, whatever umask
    # it was started with (the unit sets UMask=0077 too; statedir.py sets the modes it creates);
    # given back at the end for callers that run main() in their own process (tests)
    umask = os.umask(0o077)
    try:
        return _run(args)
    finally:
        os.umask(umask)
        settings.allow_insecure_config(insecure)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command == "run":
            cfg = load(args.config)
            from shipper.logs import setup_logging
            from shipper.service import serve
            setup_logging(cfg.log_level)
            return asyncio.run(serve(cfg, args.config))
        if args.command == "check":
            from shipper.commands.check import check
            return check(args.config)
        if args.command == "status":
            from shipper.commands.status import status
            return status(args.config, as_json=args.json, state_dir=args.state_dir)
        if args.command == "dlq":
            from shipper.commands.dlq import dlq
            return dlq(args.config, args.action)
        if args.command == "pipe":
            from shipper.commands.pipe import pipe
            return pipe(args)
        if args.command == "template":
            from shipper.commands.template import template
            return template(args.config, print_only=args.print_only, force=args.force)
        if args.command == "state":
            from shipper.commands.state import state
            return state(args.config, args.action, state_dir=args.state_dir)
        if args.command == "demo":
            from shipper.commands.demo import demo
            return demo(lines=args.lines)
    except ConfigError as e:
        print(f"shipper: {e}", file=sys.stderr)
        return 2
    except StateDamagedError as e:       # exit 3: the unit does not restart into it
        print(f"shipper: {e}", file=sys.stderr)
        return 3
    except ShipperError as e:
        print(f"shipper: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `shipper dlq list | head`: the reader went away; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
