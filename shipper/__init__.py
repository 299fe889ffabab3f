"""shipper: tail log files, parse them, queue them durably and ship them to Elasticsearch exactly once."""

from __future__ import annotations

# pyproject.toml's `version`, written here rather than looked up in the installed metadata at every
# start: `importlib.metadata` costs ~37 ms of imports (email, zipfile, csv ...) before the first
# line is read (issue 14). tests/unit/test_version.py checks the three agree.
__version__ = "0.1.0"
