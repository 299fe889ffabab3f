"""`shipper dlq list|replay|purge`: the events Elasticsearch rejected for good."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import orjson

from shipper.commands.status import daemon_running
from shipper.config import load_config
from shipper.spool import Spool


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def make_body(items: list[dict[str, Any]]) -> tuple[bytes, int]:
    """Dead letters -> a bulk body with their original index and _id (a replay can never duplicate)."""
    parts = []
    for it in items:
        action = {"create": {"_index": it["index"], "_id": it.get("id") or None}}
        if action["create"]["_id"] is None:
            del action["create"]["_id"]
        parts.append(orjson.dumps(action) + b"\n" + it["document"] + b"\n")
    return b"".join(parts), len(parts)


def dlq(config_path: str, action: str) -> int:
    cfg = load_config(config_path)
    if action != "list" and daemon_running(cfg.state_dir):
        print("shipper: the daemon is running; stop it (systemctl stop shipper) before dlq replay/purge",
              file=sys.stderr)
        return 1
    spool = Spool(cfg.state_dir, read_only=(action == "list"))
    try:
        if action == "list":
            for _key, it in spool.dead_letter_items():
                try:
                    document = orjson.loads(it["document"])
                except orjson.JSONDecodeError:
                    document = it["document"].decode("utf-8", "replace")
                print(orjson.dumps({"index": it["index"], "reason": it["reason"], "status": it["status"],
                                    "document": document, "at": _iso(it["at"])}).decode())
            return 0
        if action == "purge":
            n = spool.purge_dead_letters()
            print(f"purged {n} dead letter(s)", file=sys.stderr)
            return 0
        n = spool.replay_dead_letters(make_body, cfg.output.compression == "gzip")
        print(f"re-queued {n} dead letter(s); they are sent when the daemon runs", file=sys.stderr)
        return 0
    finally:
        spool.close()
