"""`shipper check`: validate the config, list the files the globs match now (for a journald input:
whether the journal is readable and how many entries match), try each output host, and judge the
index templates (installed? covering the indices? a data-stream trap?)."""

from __future__ import annotations

import asyncio
import os

from shipper import settings
from shipper.config import InputConfig
from shipper.ship import batching
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient
from shipper.ship.template import Inspection, inspect
from shipper.sources.journald import check_journal
from shipper.tail import discovery


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


def check(config_path: str) -> int:
    cfg = settings.load(config_path)
    ok = True
    print(f"config: {config_path}: valid")
    found = discovery.scan(cfg.inputs)
    for idx, inp in enumerate(cfg.inputs):
        if inp.journald is not None:
            line, well = journald_report(idx, inp)
            print(line)
            ok = ok and well
            continue
        paths = sorted(p for p, i in found.items() if i == idx)
        print(f"input {idx}: {', '.join(inp.paths)} ({inp.format}): {len(paths)} file(s)")
        for p in paths[:50]:
            try:
                size = os.path.getsize(p)
                readable = os.access(p, os.R_OK)
            except OSError:
                size, readable = 0, False
            print(f"  {p} ({size} bytes){'' if readable else '  NOT READABLE'}")
            ok = ok and readable
        if len(paths) > 50:
            print(f"  ... and {len(paths) - 50} more")
    if not cfg.inputs:
        print("inputs: none configured")
    sd = cfg.state_dir
    probe = sd if os.path.isdir(sd) else os.path.dirname(sd.rstrip("/")) or "/"
    if not os.access(probe, os.W_OK):
        print(f"state_dir: {sd}: NOT WRITABLE")
        ok = False
    else:
        print(f"state_dir: {sd}: writable")

    async def probe_output() -> tuple[list[tuple[str, bool, str]], Inspection, dict[str, str]]:
        client = BulkClient(cfg.output, Backoff(cfg.retry.initial_backoff_s, cfg.retry.max_backoff_s))
        routes = {h.label: h.route for h in client.hosts} if any(h.proxy for h in client.hosts) else {}
        try:
            probes = await client.probe()
            if not any(up for _h, up, _d in probes):
                return probes, Inspection(), routes
            return probes, await inspect(client, cfg), routes
        finally:
            await client.close()

    probes, templates, routes = asyncio.run(probe_output())
    for host, up, detail in probes:
        print(f"output: {host}: {'ok' if up else 'FAILED'} ({detail})")
        if host in routes:
            # the probe above went the same way: a proxy that refuses shows as the host's failure
            print(f"output: {host}: reached {routes[host]}")
        ok = ok and up
    if not cfg.output.tls.verify and any(h.startswith("https:") for h in cfg.output.hosts):
        print("output: WARNING: TLS verification is off (tls.verify: false)")
    if cfg.output.document_id == "none":
        print(f"output: WARNING: {batching.AT_LEAST_ONCE}")
    for f in templates.findings:
        print(f.text if f.ok else f"WARNING: {f.text}")
    ok = ok and templates.ok
    print("all well" if ok else "problems found")
    return 0 if ok else 1
