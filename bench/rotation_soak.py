"""Rotation soak on many files: every line once while files rotate in every logrotate mode.

(bench/soak.py is the long one: one file, rename rotation, kill -9 and restarts, RSS and fds over
minutes against osmem-server. This one is short and wide: many files, most of them quiet.)

Drives the real daemon (`shipper run`, as discovery.py does) on `--files` files under one `**`
glob against bench/sink.py --verify. A writer appends to `--busy` of them at about `--rate`
lines/s while the rest stay idle (quiet: read again only when inotify names them); now and then
one file, busy or idle, is rotated as logrotate would (tests/support/rotate.py: create or
copytruncate, each file with its own fixed policy of compress and delaycompress, rotate 3).
Then it waits for every line and checks the sink's count: each `seq` once, no `_id` twice.

    .venv/bin/python bench/rotation_soak.py [--files 200] [--busy 20] [--seconds 60] [--rate 500]
                                            [--rotate-every 0.3] [--seed 7] [--json PATH]

Exit status 1 if anything was lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Literal

import yaml

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.dirname(BENCH_DIR))

from discovery import Failed, cpu_s, file_names, line, make_files, wait_for  # noqa: E402
from run import machine_info, machine_line, shipper_config, stop_system  # noqa: E402
from sink import SinkProcess  # noqa: E402

from tests.support.rotate import rotate  # noqa: E402

MODES: list[Literal["create", "copytruncate"]] = ["create", "copytruncate"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="bench-soak-", dir=args.tmp_dir)
    root = os.path.join(tmp, "logs")
    names = file_names(args.files)
    seq = make_files(root, names, 0, 3)
    busy = rng.sample(names, min(args.busy, len(names)))
    policy: dict[str, tuple[Literal["create", "copytruncate"], bool, bool]] = {}
    for n in names:
        compress = rng.random() < 0.5
        policy[n] = (rng.choice(MODES), compress, compress and rng.random() < 0.5)
    cfg_path = shipper_config(tmp, os.path.join(root, "**", "*.log"), "http://127.0.0.1:9", log_level="info")
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    sink = SinkProcess(verify=True, python=args.python)
    cfg["output"]["elasticsearch"]["hosts"] = [sink.url]
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    result: dict[str, Any] = {"files": args.files, "busy": len(busy), "seconds": args.seconds, "seed": args.seed}
    err_path = os.path.join(tmp, "stderr.log")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([args.python, "-m", "shipper", "run", "-c", cfg_path], stdout=subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL, cwd=tmp, start_new_session=True)
    ok = False
    rotations = {"create": 0, "copytruncate": 0, "of idle files": 0}
    try:
        wait_for(sink, seq, args.timeout, proc, "catch-up")
        c0, t0 = cpu_s(proc.pid), time.monotonic()
        t_end = t0 + args.seconds
        next_rotation = t0 + args.rotate_every
        gap = 1.0 / args.rate
        while time.monotonic() < t_end:
            name = rng.choice(busy)
            with open(os.path.join(root, name), "ab") as f:
                f.write(line(seq))
            seq += 1
            time.sleep(gap)
            if time.monotonic() >= next_rotation:
                next_rotation += args.rotate_every
                name = rng.choice(busy if rng.random() < 0.5 else names)     # busy and quiet ones
                mode, compress, delay = policy[name]
                rotate(os.path.join(root, name), mode=mode, keep=3, compress=compress, delaycompress=delay)
                rotations[mode] += 1
                rotations["of idle files"] += name not in busy
        result["written_s"] = time.monotonic() - t0
        result["lines"] = seq
        result["rotations"] = rotations
        t1 = wait_for(sink, seq, args.timeout, proc, "every line")
        result["drain_s"] = t1 - t_end
        result["cpu_s"] = cpu_s(proc.pid) - c0
        ok = True
    except Failed as e:
        result["error"] = str(e)
        print(f"!! {e}", flush=True)
    finally:
        reaped, killed = stop_system(proc.pid, proc.pid, 20)
        result["exit_code"] = None if reaped is None else reaped[0]
        final = sink.stop() or {}
    verify = final.get("verify", {})
    lost = seq - int(verify.get("distinct_seqs", 0))
    dup = int(verify.get("duplicate_ids", 0)) + int(verify.get("duplicate_seqs", 0))
    result.update(expected=seq, lost=lost, duplicates=dup, requests=final.get("requests"))
    result["ok"] = ok = ok and lost == 0 and dup == 0 and result["exit_code"] == 0 and not killed
    print(f"  {seq:,} lines to {len(busy)} busy of {args.files} files over {args.seconds:.0f} s, "
          f"{sum(v for k, v in rotations.items() if k != 'of idle files')} rotations "
          f"({rotations['create']} create, {rotations['copytruncate']} copytruncate, "
          f"{rotations['of idle files']} of idle files); sink: {verify.get('distinct_seqs', 0):,} lines, "
          f"{lost} lost, {dup} duplicated; exit code {result['exit_code']}", flush=True)
    if ok and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        result["tmp"] = tmp
        print(f"  kept: {tmp} (stderr: {err_path})", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--busy", type=int, default=20, help="files the writer appends to")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=500.0, help="lines/s, about (one write per line)")
    ap.add_argument("--rotate-every", type=float, default=0.3, help="seconds between rotations")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tmp-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)
    info = machine_info()
    print(machine_line(info), flush=True)
    result = run(args)
    result["machine"] = info
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
