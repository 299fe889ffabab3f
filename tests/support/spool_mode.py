"""The suite in either spool mode (issue 46): `pytest --spool always` (or SHIPPER_TEST_SPOOL=always)
makes `queue.spool: always` the default of every config the tests build or load, in this process and
in every Python child it starts (the daemon, the CLI, `shipper pipe`, the bench harnesses), through
tests/support/spool_always/sitecustomize.py on PYTHONPATH. A test that sets `queue.spool` keeps it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

ENV = "SHIPPER_TEST_SPOOL"
MODES = ("when_behind", "always")
PRODUCT_DEFAULT = "when_behind"     # SPEC: queue.spool's default
SITE_DIR = Path(__file__).resolve().parent / "spool_always"


def use(mode: str) -> None:
    """Make `mode` the default of QueueConfig (what `Config()` builds and what the loader falls back
    to for a file without `queue.spool`)."""
    import dataclasses

    from shipper import config

    fields = [f.name for f in dataclasses.fields(config.QueueConfig)]
    defaults = list(config.QueueConfig.__init__.__defaults__ or ())
    defaults[fields.index("spool")] = mode
    config.QueueConfig.__init__.__defaults__ = tuple(defaults)
    config._QUEUE_DEFAULTS = config.QueueConfig()


@contextlib.contextmanager
def product_default() -> Iterator[None]:
    """For a test of the configuration itself (what the sample config spells out): the product's
    own default meanwhile, whatever mode the suite runs in."""
    mode = current()
    use(PRODUCT_DEFAULT)
    try:
        yield
    finally:
        use(mode)


def in_children(mode: str) -> None:
    """Every Python child started from now on (with this environment) defaults to `mode` too."""
    os.environ[ENV] = mode
    if mode != "when_behind":
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), path]))


def current() -> str:
    from shipper.config import QueueConfig
    return QueueConfig().spool
