"""`shipper check`: validate the config, list the files the globs match now (for a journald input:
whether the journal is readable and how many entries match), try each output host, and judge the
index templates (installed? covering the indices? a data-stream trap?)."""

from __future__ import annotations

import asyncio
import fnmatch
import os
from collections.abc import Sequence

from shipper import settings
from shipper.clock import SystemClock
from shipper.config import InputConfig
from shipper.ship import batching
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient
from shipper.ship.template import inspect
from shipper.ship.template_body import Inspection
from shipper.sources.journald.probe import check_journal
from shipper.tail import discovery, opening
from shipper.tail.discovery import is_excluded
from shipper.tail.opening import Refused
from shipper.tail.scan import base_dir


def journald_report(idx: int, inp: InputConfig) -> tuple[str, bool]:
    """The line `shipper check` prints for a journald input, and whether it is well."""
    assert inp.journald is not None
    j = inp.journald
    where = j.directory or "the system journal"
    units = ", ".join(j.units) if j.units else "every unit"
    c = check_journal(j.directory, j.units)
    head = f"input {idx}: journald {where} ({units}; {inp.format})"
    if not c.is_readable:
        return f"{head}: NOT READABLE ({c.detail})", False
    count = f"at least {c.entries}" if c.is_capped else str(c.entries)
    note = f" ({c.detail})" if c.detail else ""
    verb = "entry matches" if count == "1" else "entries match"
    return f"{head}: readable, {count} {verb}{note}", True


def file_note(path: str, rule: opening.Rule) -> tuple[str, bool]:
    """What `check` says of a matched file, opened as the daemon opens it: (its note, readable?)."""
    got = opening.open_log(path, rule)
    if isinstance(got, opening.Refused):
        return f"  not read: {got.reason}{f' ({got.rule})' if got.rule else ''}", True
    if got is None:
        return "  NOT READABLE", False
    fd, st = got
    os.close(fd)
    return f" ({st.st_size} bytes)", True


PROTECTED_HARDLINKS = "/proc/sys/fs/protected_hardlinks"


def hardlink_warning(sysctl: str = PROTECTED_HARDLINKS) -> str | None:
    """What to say when the kernel lets users hard-link files they cannot read (a hard link is the
    file itself: the trust rules cannot tell it from the user's own); None when it does not."""
    try:
        with open(sysctl) as f:
            value = f.read().strip()
    except OSError:
        return None
    if value != "0":
        return None
    return ("fs.protected_hardlinks is 0: a user who can write a watched directory can hard-link a file "
            "they cannot read into it, and shipper would read it (sysctl -w fs.protected_hardlinks=1)")


def _input_of(path: str, inputs: Sequence[InputConfig]) -> int | None:
    """The first input with a glob matching `path` (or below whose fixed part it lies: a `**` walk's link)."""
    for i, inp in enumerate(inputs):
        if is_excluded(path, inp.exclude):
            continue
        for g in inp.paths:
            g = os.path.expanduser(g)
            if fnmatch.fnmatch(path, g) or opening.is_under(path, base_dir(g)[0]):
                return i
    return None


def check(config_path: str) -> int:
    cfg = settings.load(config_path)
    ok = True
    print(f"config: {config_path}: valid")
    refused: list[Refused] = []
    found = discovery.scan(cfg.inputs, refused)
    for idx, inp in enumerate(cfg.inputs):
        if inp.journald is not None:
            line, well = journald_report(idx, inp)
            print(line)
            ok = ok and well
            continue
        paths = sorted(p for p, i in found.items() if i == idx)
        print(f"input {idx}: {', '.join(inp.paths)} ({inp.format}): {len(paths)} file(s)")
        bases = discovery.glob_bases(inp)
        for n, p in enumerate(paths):
            note, readable = file_note(p, opening.glob_rule(p, bases, inp.symlinks))
            ok = ok and readable
            if n < 50:
                print(f"  {p}{note}")
        if len(paths) > 50:
            print(f"  ... and {len(paths) - 50} more")
        # what the trust rules keep this input from reading (SPEC, Trust boundaries): said, not a fault
        mine = sorted({(r.path, r.reason, r.rule) for r in refused if _input_of(r.path, cfg.inputs) == idx})
        for path, reason, rule in mine[:50]:
            print(f"  {path}: not read: {reason}{f' ({rule})' if rule else ''}")
        if len(mine) > 50:
            print(f"  ... and {len(mine) - 50} more not read")
    if not cfg.inputs:
        print("inputs: none configured")
    warning = hardlink_warning() if any(inp.journald is None for inp in cfg.inputs) else None
    if warning:
        print(f"inputs: WARNING: {warning}")
    sd = cfg.state_dir
    probe = sd if os.path.isdir(sd) else os.path.dirname(sd.rstrip("/")) or "/"
    if not os.access(probe, os.W_OK):
        print(f"state_dir: {sd}: NOT WRITABLE")
        ok = False
    else:
        print(f"state_dir: {sd}: writable")

    async def probe_output() -> tuple[list[tuple[str, bool, str]], Inspection, dict[str, str]]:
        clock = SystemClock()
        client = BulkClient(cfg.output, Backoff(cfg.retry.initial_backoff_s, cfg.retry.max_backoff_s), clock=clock)
        routes = {h.label: h.route for h in client.hosts} if any(h.proxy for h in client.hosts) else {}
        try:
            probes = await client.probe()
            if not any(up for _h, up, _d in probes):
                return probes, Inspection(), routes
            return probes, await inspect(client, cfg, clock.time()), routes
        finally:
            await client.close()

    probes, templates, routes = asyncio.run(probe_output())
    for host, up, detail in probes:
        print(f"output: {host}: {'ok' if up else 'FAILED'} ({detail})")
        if host in routes:
            # the probe above went the same way: a proxy that refuses shows as the host's failure
            print(f"output: {host}: reached {routes[host]}")
        ok = ok and up
    for detail in cfg.output.cleartext_credentials():
        print(f"output: WARNING: {detail}")
    if not cfg.output.tls.verify and any(h.startswith("https:") for h in cfg.output.hosts):
        print("output: WARNING: TLS verification is off (tls.verify: false)")
    if cfg.output.document_id == "none":
        print(f"output: WARNING: {batching.AT_LEAST_ONCE}")
    for f in templates.findings:
        print(f.text if f.ok else f"WARNING: {f.text}")
    ok = ok and templates.ok
    print("all well" if ok else "problems found")
    return 0 if ok else 1
