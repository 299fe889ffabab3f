"""On PYTHONPATH only while the suite runs with `--spool always` (tests/support/spool_mode.py):
every Python child of the tests (the daemon, the CLI) defaults to `queue.spool: always` too."""

import os

if os.environ.get("SHIPPER_TEST_SPOOL") == "always":
    try:
        from tests.support import spool_mode
    except ImportError:            # a child whose PYTHONPATH lacks the repository: the real default
        pass
    else:
        spool_mode.use("always")
