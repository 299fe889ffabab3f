"""The peers as bench systems: syslog-ng 3.38 and rsyslog 8.2302, each its own foreground process.

Unpacked (not installed) by bench/setup_peers.sh into bench/peers/root; `peer_command` writes the
peer's config into the run's temp dir and returns its argv and environment. Each reads one file
from its start and posts to the bench sink's `/_bulk`, the raw line as the document:

- syslog-ng: `file(... flags(no-parse) follow-freq(1))` -> `elasticsearch-http(url(...) index("bench")
  type("") batch-lines(1000) workers(4) template("$MESSAGE"))`, `flags(flow-control)`; the source
  window is raised to `log-iw-size(10000) log-fetch-limit(1000)` (with the default 100 it sends
  ~11 docs per request and runs at ~5,000 docs/s).
- rsyslog: `imfile` (inotify, from the start of the file) -> `omelasticsearch` with `bulkmode="on"`,
  a linked-list action queue dequeuing batches of up to 1000, template `%msg%`.

Neither parses the JSON, adds an `_id`, compresses, or keeps a durable queue: they do less work
than shipper per line (flow control and their in-memory queues are all they promise).
"""

from __future__ import annotations

import os
import subprocess
import urllib.parse

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
PEERS_ROOT = os.path.join(BENCH_DIR, "peers", "root")
SETUP = os.path.join(BENCH_DIR, "setup_peers.sh")
PEERS = ("syslog-ng", "rsyslog")

SYSLOG_NG_CONF = """\
@version: 3.38
@include "{scl}/elasticsearch/elastic-http.conf"
options {{ stats-freq(0); }};
source s_file {{
  file("{path}" flags(no-parse) follow-freq(1) log-iw-size(10000) log-fetch-limit(1000));
}};
destination d_es {{
  elasticsearch-http(url("{url}/_bulk") index("bench") type("") batch-lines(1000) workers(4)
                     template("$MESSAGE"));
}};
log {{ source(s_file); destination(d_es); flags(flow-control); }};
"""

RSYSLOG_CONF = """\
global(workDirectory="{tmp}" maxMessageSize="64k")
module(load="imfile" mode="inotify")
module(load="omelasticsearch")
template(name="raw" type="string" string="%msg%")
input(type="imfile" file="{path}" tag="app" ruleset="ship" freshStartTail="off" readMode="0")
ruleset(name="ship") {{
  action(type="omelasticsearch" server="{host}" serverport="{port}" searchIndex="bench" template="raw"
         bulkmode="on" maxbytes="100m" action.resumeRetryCount="-1"
         queue.type="linkedList" queue.size="100000" queue.dequeueBatchSize="1000")
}}
"""


def ensure_peers() -> None:
    """Run bench/setup_peers.sh (idempotent: returns at once when the peers are unpacked)."""
    subprocess.run(["bash", SETUP], check=True)


def _libs() -> str:
    dirs = [os.path.join(PEERS_ROOT, d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu",
                                                 "usr/lib/syslog-ng")]
    return ":".join(dirs)


def peer_command(system: str, tmp: str, input_path: str, url: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment for `system` reading `input_path` into the sink at `url`."""
    env = dict(os.environ, LD_LIBRARY_PATH=_libs())
    if system == "syslog-ng":
        conf = os.path.join(tmp, "syslog-ng.conf")
        with open(conf, "w") as f:
            f.write(SYSLOG_NG_CONF.format(scl=os.path.join(PEERS_ROOT, "usr/share/syslog-ng/include/scl"),
                                          path=input_path, url=url.rstrip("/")))
        return [os.path.join(PEERS_ROOT, "usr/sbin/syslog-ng"), "-F", "-e", "--no-caps", "-f", conf,
                f"--module-path={os.path.join(PEERS_ROOT, 'usr/lib/syslog-ng/3.38')}",
                "-R", os.path.join(tmp, "syslog-ng.persist"), "-c", os.path.join(tmp, "syslog-ng.ctl"),
                "-p", os.path.join(tmp, "syslog-ng.pid")], env
    if system == "rsyslog":
        u = urllib.parse.urlsplit(url)
        conf = os.path.join(tmp, "rsyslog.conf")
        with open(conf, "w") as f:
            f.write(RSYSLOG_CONF.format(tmp=tmp, path=input_path, host=u.hostname, port=u.port))
        return [os.path.join(PEERS_ROOT, "usr/sbin/rsyslogd"), "-n", "-M",
                os.path.join(PEERS_ROOT, "usr/lib/x86_64-linux-gnu/rsyslog"), "-f", conf,
                "-i", os.path.join(tmp, "rsyslogd.pid")], env
    raise ValueError(f"not a peer: {system!r}")
