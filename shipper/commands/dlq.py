"""`shipper dlq list|replay|purge`: the events Elasticsearch rejected for good. With no daemon
running the command opens the spool itself; with one, replay and purge are requests the daemon
carries out (control.py), so only the daemon writes its spool; list only reads."""

from __future__ import annotations

import datetime as dt
import os
import sys
import uuid
from typing import Any

import orjson

from shipper import settings, statedir
from shipper.clock import SystemClock
from shipper.commands.status import daemon_running
from shipper.config import Config
from shipper.control import DlqAction, dlq_cancel, dlq_read_answer, dlq_request
from shipper.errors import ShipperError
from shipper.ship import bulk as bulkproto
from shipper.spool import Spool

ANSWER_WAIT_S = 30.0


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def list_line(it: dict[str, Any]) -> str:
    """One stored dead letter -> SPEC's line: {"index", "reason", "status", "document", "at"}."""
    try:
        document: Any = orjson.loads(it["document"])
    except orjson.JSONDecodeError:
        document = bytes(it["document"]).decode("utf-8", "replace")
    return orjson.dumps({"index": it["index"], "reason": it["reason"], "status": it["status"],
                         "document": document, "at": _iso(it["at"])}).decode()


def _through_daemon(state_dir: str, action: DlqAction) -> int:
    nonce = uuid.uuid4().hex
    dlq_request(state_dir, action, nonce)
    clock = SystemClock()
    deadline = clock.monotonic() + ANSWER_WAIT_S
    while clock.monotonic() < deadline:
        n = dlq_read_answer(state_dir, nonce)
        if n is not None:
            verb = "re-queued" if action == "replay" else "purged"
            print(f"{verb} {n} dead letter(s)" + ("; the running daemon is sending them" if action == "replay" else ""),
                  file=sys.stderr)
            return 0
        clock.pause(0.1)
    if dlq_cancel(state_dir):
        print(f"shipper: the running daemon did not take the {action} request within {ANSWER_WAIT_S:g}s; "
              "nothing was changed", file=sys.stderr)
        return 1
    print(f"shipper: the daemon took the {action} request but has not answered yet; "
          "check `shipper dlq list` and `shipper status`", file=sys.stderr)
    return 1


def dlq(config_path: str, action: str) -> int:
    cfg = settings.load(config_path)
    with statedir.as_owner(cfg.state_dir):       # root on another user's state dir: as that user
        return _dlq(cfg, action)


def _dlq(cfg: Config, action: str) -> int:
    if action == "list":
        if not os.path.isdir(os.path.join(cfg.state_dir, "spool")):
            return 0
        spool = Spool(cfg.state_dir, read_only=True)
        try:
            for _key, it in spool.dead_letter_items():
                print(list_line(it))
        finally:
            spool.close()
        return 0
    if action not in ("replay", "purge"):
        raise ValueError(f"unknown dlq action {action!r}")
    act: DlqAction = "replay" if action == "replay" else "purge"
    if daemon_running(cfg.state_dir):
        return _through_daemon(cfg.state_dir, act)
    from shipper.service import StateLock
    try:
        lock = StateLock(cfg.state_dir)     # no daemon may start on this spool meanwhile
    except ShipperError:
        return _through_daemon(cfg.state_dir, act)
    try:
        spool = Spool(cfg.state_dir)
        try:
            if action == "purge":
                n = spool.purge_dead_letters()
                print(f"purged {n} dead letter(s)", file=sys.stderr)
                return 0
            out = cfg.output

            def bodies(items: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
                return bulkproto.dead_letter_bodies(items, out.bulk_max_events, out.bulk_max_bytes,
                                                    out.document_id == "auto")

            batches = spool.replay_dead_letters(bodies, out.compression == "gzip")
            n = sum(m.events for m, _ in batches)
            print(f"re-queued {n} dead letter(s); they are sent when the daemon runs", file=sys.stderr)
            return 0
        finally:
            spool.close()
    finally:
        lock.release()
