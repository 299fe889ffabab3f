"""A fast in-test Elasticsearch stand-in: `_bulk` with `create` semantics on a thread, loopback only.

For volume (osmem indexes ~200 documents of 3 KB a second) and for in-process pipelines: every
item is answered 201, or 409 for an `_id` it already has; it keeps each document by `_id` (the
first one), counts the repeats, and, given a promptness timeline, stamps each creation on it as the
recording proxy does in front of osmem (tests/support/promptness.py).
"""

from __future__ import annotations

import gzip
import http.server
import json
import threading
from typing import Any

from tests.support.promptness import Timeline


class BulkSink:
    def __init__(self, timeline: Timeline | None = None) -> None:
        sink = self
        self.docs: dict[str, dict[str, Any]] = {}
        self.dups: list[str] = []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer({"version": {"number": "8.0.0-sink"}})

            def do_POST(self) -> None:
                sent = timeline.bulk_sent() if timeline is not None else 0.0
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                lines = raw.split(b"\n")
                items = []
                created = []
                with sink.lock:
                    for i in range(0, len(lines) - 1, 2):
                        doc_id = json.loads(lines[i])["create"]["_id"]
                        if doc_id in sink.docs:
                            sink.dups.append(doc_id)
                            items.append({"create": {"status": 409}})
                        else:
                            sink.docs[doc_id] = json.loads(lines[i + 1])
                            created.append(doc_id)
                            items.append({"create": {"status": 201}})
                if timeline is not None:
                    timeline.acked(created, sent, announced=True)
                self._answer({"errors": len(created) < len(items), "items": items})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self) -> int:
        with self.lock:
            return len(self.docs)

    def hits(self) -> list[dict[str, Any]]:
        """The documents as search hits (`_id`, `_source`), for the oracles."""
        with self.lock:
            return [{"_id": i, "_source": d} for i, d in self.docs.items()]

    def reset(self) -> None:
        with self.lock:
            self.docs.clear()
            self.dups.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
