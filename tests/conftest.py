"""Fixtures shared by component and e2e tests: osmem-backed `es`, `fault_proxy`, `daemon_factory`.

`osmem_server` (session) and `osmem_clone` (per test) come from the osmem-server pytest plugin;
the helpers themselves live in tests/support/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from osmem_server import OsmemServer

from tests.support import spool_mode
from tests.support.daemon import Daemon
from tests.support.es import ES
from tests.support.proxy import FaultProxy


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--spool", choices=spool_mode.MODES, default=os.environ.get(spool_mode.ENV) or None,
                     help="queue.spool for every config the tests build that does not set it "
                          "(default: the product's, when_behind; env SHIPPER_TEST_SPOOL)")


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--spool")
    if mode:
        spool_mode.use(mode)
        spool_mode.in_children(mode)


def pytest_report_header(config: pytest.Config) -> str:
    return f"queue.spool default under test: {spool_mode.current()}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Remember each phase's report so fixtures can show diagnostics only when a test failed.
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))


@pytest.fixture(scope="session")
def osmem_server(request: pytest.FixtureRequest) -> Iterator[OsmemServer]:
    """The plugin's session server, plus closing its stdout pipe: the plugin leaves it open,
    which is a ResourceWarning, and filterwarnings=error turns that into a teardown error."""
    cfg = request.config
    server = OsmemServer.start(
        seed=[str(p) for p in cfg.getini("osmem_seed")],
        freeze=cfg.getini("osmem_freeze"),
        japanese=cfg.getini("osmem_japanese"),
    )
    try:
        yield server
    finally:
        server.close()
        for pipe in (server.process.stdout, server.process.stdin):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def es(osmem_clone: Any) -> ES:
    """A sync client on a fresh osmem clone (the same clone as `fault_proxy`'s upstream)."""
    return ES(osmem_clone.url)


@pytest.fixture
def fault_proxy(osmem_clone: Any) -> Iterator[FaultProxy]:
    """A started FaultProxy in front of this test's osmem clone; stopped afterwards."""
    with FaultProxy(osmem_clone.url) as proxy:
        yield proxy


DaemonFactory = Callable[..., Daemon]


@pytest.fixture
def daemon_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DaemonFactory]:
    """`daemon_factory(config_path, cwd=None, env=None, start=True)` -> a started Daemon.

    At teardown every daemon still running is killed with SIGKILL (no process outlives its
    test), and when the test failed the tail of each daemon's output is printed.
    """
    daemons: list[Daemon] = []

    def make(
        config_path: str | os.PathLike[str],
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        start: bool = True,
        **kwargs: Any,
    ) -> Daemon:
        d = Daemon(config_path, cwd=cwd, env=env, **kwargs)
        daemons.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in daemons:
        d.kill9()
    if _failed(request):
        for i, d in enumerate(daemons):
            print(f"\n=== daemon {i} ({d.config_path}), exit code {d.returncode} ===\n{d.tail(200)}")


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp dir `nobody` can traverse (pytest's own base dir is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="shipper-open-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
