"""shipper: tail log files and the systemd journal, parse them, queue them durably and ship them to
Elasticsearch exactly once. This package file holds only the version."""

from __future__ import annotations

# pyproject.toml's `version`, written here rather than looked up in the installed metadata at every
# start: `importlib.metadata` imports email, zipfile, csv ... before the first line is read
# (docs/development.md). tests/unit/test_version.py checks the three agree.
__version__ = "0.1.0"
