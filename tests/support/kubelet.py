"""Kubernetes' container log layout and the kubelet's own rotation of it, on real files.

Layout (kubelet's kuberuntime): the runtime writes `/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log`;
`/var/log/containers/<pod>_<ns>_<container>-<container id>.log` is a symlink to it (absolute target).

Rotation, step for step as pkg/kubelet/logs/container_log_manager.go's rotateLog does it when
`<N>.log` passes containerLogMaxSize:
  1. remove leftovers: `*.tmp` of an interrupted compression, and a plain rotated file whose
     `.gz` already exists (cleanupUnusedLogs);
  2. remove the oldest rotated files beyond containerLogMaxFiles - 2 (removeExcessLogs);
  3. compress every rotated file that is still plain: gzip `X` into `X.tmp`, rename it `X.gz`,
     remove `X` (compressLog) -- so the newest rotated piece stays plain until the next rotation;
  4. rename `<N>.log` to `<N>.log.<YYYYmmdd-HHMMSS>` and ask the runtime to reopen its log
     (rotateLatestLog; the runtime creates `<N>.log` anew).
"""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PodLog:
    """One container's log in the kubelet layout."""

    root: Path            # stands for /var/log
    namespace: str
    pod: str
    uid: str
    container: str
    container_id: str     # 64 hex
    restart: int = 0

    @property
    def target(self) -> Path:
        return (self.root / "pods" / f"{self.namespace}_{self.pod}_{self.uid}" / self.container
                / f"{self.restart}.log")

    @property
    def link(self) -> Path:
        return self.root / "containers" / f"{self.pod}_{self.namespace}_{self.container}-{self.container_id}.log"

    @property
    def pod_dir(self) -> Path:
        return self.root / "pods" / f"{self.namespace}_{self.pod}_{self.uid}"

    def create(self) -> None:
        """The pod's directories, an empty log and the symlink to it (as kubelet + runtime make them)."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.target.touch()
        self.link.parent.mkdir(parents=True, exist_ok=True)
        if not self.link.is_symlink():
            os.symlink(self.target, self.link)

    def delete_pod(self) -> None:
        """The pod is deleted: kubelet removes the symlink and the pod's log directory."""
        if self.link.is_symlink():
            self.link.unlink()
        shutil.rmtree(self.pod_dir, ignore_errors=True)


def rotated_name(log: Path, now: float) -> Path:
    return log.with_name(f"{log.name}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}")


def kubelet_rotate(log: str | os.PathLike[str], now: float, reopen: Callable[[], None],
                   max_files: int = 5) -> Path:
    """Rotate `log` the way the kubelet does (module docstring); `reopen` stands for the CRI call
    ReopenContainerLog (the runtime writer's `reopen`). Returns the rotated file's path.
    `now` names the rotated file (UTC here; the kubelet uses the node's local zone)."""
    log = Path(log)
    pieces = sorted(glob.glob(glob.escape(str(log)) + ".*"))
    kept = []
    for p in pieces:                                            # 1. cleanupUnusedLogs
        if p.endswith(".tmp") or not p.endswith(".gz") and os.path.exists(p + ".gz"):
            os.remove(p)
        else:
            kept.append(p)
    keep = max(max_files - 2, 0)                                # 2. removeExcessLogs
    while len(kept) > keep:
        os.remove(kept.pop(0))
    for p in kept:                                              # 3. compressLog
        if p.endswith(".gz"):
            continue
        tmp = p + ".tmp"
        with open(p, "rb") as src, open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw) as gz:
            shutil.copyfileobj(src, gz)
        os.rename(tmp, p + ".gz")
        os.remove(p)
    rotated = rotated_name(log, now)                            # 4. rotateLatestLog
    os.rename(log, rotated)
    reopen()
    return rotated
