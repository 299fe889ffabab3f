"""Symbolic links in discovery, on real directories in the kubelet's layout: links resolved to their
targets, the targets' directories watched (a rotation there is seen at once, not at the next
rescan), writes on a target reported under the link's path, a removed pod directory unwatched."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from shipper.config import InputConfig
from shipper.tail import discovery, watch
from tests.support.container_writer import RuntimeLog, cri_record
from tests.support.kubelet import PodLog, kubelet_rotate
from tests.support.wait import async_wait_until

CID = "4c01db0b339c7a8a2a4f1b6e1e3d5a2f9c8b7a6d5e4f3c2b1a09988776655440"
T0 = 1_796_119_200 * 10**9


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def pod_log(root: Path, pod: str = "checkout-7d9f8b6c5-x2x9q") -> PodLog:
    p = PodLog(root, "shop", pod, "0b8e1c2a-5f3d-4e21-9c1b-7a6d5e4f3c2b", "api", CID)
    p.create()
    return p


def containers_input(root: Path) -> InputConfig:
    return InputConfig(paths=(str(root / "containers" / "*.log"),), format="cri")


def test_resolve_links_in_the_kubelet_layout(tmp_path: Path) -> None:
    p = pod_log(tmp_path)
    (tmp_path / "containers" / "plain.log").write_bytes(b"x\n")
    found = discovery.scan([containers_input(tmp_path)])
    links = discovery.resolve_links(found)
    assert set(found) == {str(p.link), str(tmp_path / "containers" / "plain.log")}
    assert links == {str(p.link): discovery.LinkTarget(str(p.link), str(p.target), (str(p.target.parent),))}
    assert watch.link_watch_targets(links.values()) == [(str(p.target.parent), False)]


def test_resolve_link_chains_relative_dangling_and_loops(tmp_path: Path) -> None:
    # dockershim: /var/log/containers -> /var/log/pods/.../0.log -> /var/lib/docker/containers/<id>/<id>-json.log
    real = tmp_path / "docker" / CID / f"{CID}-json.log"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"{}\n")
    mid = tmp_path / "pods" / "ns_pod_uid" / "c" / "0.log"
    mid.parent.mkdir(parents=True)
    os.symlink(os.path.relpath(real, mid.parent), mid)                      # relative target
    link = tmp_path / "containers" / "pod_ns_c.log"
    link.parent.mkdir()
    os.symlink(mid, link)
    lt = discovery.resolve_link(str(link))
    assert lt is not None and lt.target == str(real)
    assert lt.dirs == (str(real.parent), str(mid.parent))
    os.symlink(tmp_path / "nowhere.log", tmp_path / "dangling.log")
    os.symlink(tmp_path / "loop-b.log", tmp_path / "loop-a.log")
    os.symlink(tmp_path / "loop-a.log", tmp_path / "loop-b.log")
    for p in ("dangling.log", "loop-a.log"):
        assert discovery.resolve_link(str(tmp_path / p)) is None
    assert discovery.resolve_link(str(real)) is None                         # no link at all
    assert discovery.resolve_links([str(real), str(tmp_path / "dangling.log")]) == {}


def test_identity_is_the_targets_and_the_path_the_links(tmp_path: Path) -> None:
    p = pod_log(tmp_path)
    [(path, _idx, st)] = discovery.scan_stat([containers_input(tmp_path)])
    assert path == str(p.link)
    assert (st.st_dev, st.st_ino) == (p.target.stat().st_dev, p.target.stat().st_ino)


@pytest.fixture(params=["inotify", "watchdog"])
def make_watcher(request: pytest.FixtureRequest) -> object:
    def make(loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> object:
        if request.param == "watchdog":
            return watch.WatchdogWatcher(loop, wake)
        w = watch.make_watcher(loop, wake)
        assert isinstance(w, watch.InotifyWatcher), "inotify is expected on the test machines"
        return w
    return make


async def test_a_rotation_in_the_targets_directory_asks_for_a_rescan(tmp_path: Path, make_watcher: object) -> None:
    p = pod_log(tmp_path)
    runtime = RuntimeLog(p.target)
    inp = containers_input(tmp_path)
    wake = asyncio.Event()
    w = make_watcher(asyncio.get_running_loop(), wake)  # type: ignore[operator]
    links = discovery.resolve_links(discovery.scan([inp]))
    await asyncio.to_thread(w.watch, [inp], links)
    try:
        runtime.write_records([cri_record(b"before", "stdout", "F", T0)])
        await async_wait_until(lambda: str(p.link) in w.take_modified(),
                               "a write on the target reported under the link's path", timeout_s=5)
        w.scan_wanted = False
        rotated = kubelet_rotate(p.target, 1_796_119_200.0, runtime.reopen)
        await async_wait_until(lambda: w.scan_wanted, "the new 0.log in the pod's directory to ask for a rescan",
                               timeout_s=5)
        assert rotated.exists() and p.target.exists()
        runtime.write_records([cri_record(b"after", "stdout", "F", T0)])
        await async_wait_until(lambda: str(p.link) in w.take_modified(),
                               "a write on the new target reported under the link's path", timeout_s=5)
    finally:
        runtime.close()
        await asyncio.to_thread(w.stop)


async def test_without_the_links_the_targets_directory_is_not_watched(tmp_path: Path) -> None:
    """The fault of issue 16: only the glob's directory is watched, so writes and re-creations in
    /var/log/pods go unnoticed until the next rescan."""
    p = pod_log(tmp_path)
    inp = containers_input(tmp_path)
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    await asyncio.to_thread(w.watch, [inp])
    try:
        append(p.target, cri_record(b"unseen", "stdout", "F", T0))
        sentinel = tmp_path / "containers" / "sentinel.log"
        sentinel.write_bytes(b"x\n")
        append(sentinel, b"y\n")
        seen: set[str] = set()

        def sentinel_seen() -> bool:
            seen.update(w.take_modified())
            return str(sentinel) in seen

        await async_wait_until(sentinel_seen, "a write in the glob's directory (the later observable point)", timeout_s=5)
        assert str(p.link) not in seen and str(p.target) not in seen
    finally:
        await asyncio.to_thread(w.stop)


async def test_a_removed_pod_directory_is_unwatched_and_a_new_one_watched(tmp_path: Path) -> None:
    p = pod_log(tmp_path)
    inp = containers_input(tmp_path)
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    assert isinstance(w, watch.InotifyWatcher), "inotify is expected on the test machines"
    await asyncio.to_thread(w.watch, [inp], discovery.resolve_links(discovery.scan([inp])))
    key = f"{p.target.parent}|False"
    try:
        assert key in w._watched
        p.delete_pod()
        await async_wait_until(lambda: key not in w._watched, "the removed directory's watch to be dropped",
                               timeout_s=5)
        again = pod_log(tmp_path)            # a pod of the same name comes back (a new directory)
        await asyncio.to_thread(w.watch, [inp], discovery.resolve_links(discovery.scan([inp])))
        assert key in w._watched
        w.take_modified()
        append(again.target, cri_record(b"new pod", "stdout", "F", T0))
        await async_wait_until(lambda: str(again.link) in w.take_modified(),
                               "a write in the new pod directory to be reported", timeout_s=5)
    finally:
        await asyncio.to_thread(w.stop)
