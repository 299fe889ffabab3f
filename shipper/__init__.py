"""shipper: tail log files, parse them, queue them durably and ship them to Elasticsearch exactly once."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version


def _version() -> str:
    """The installed distribution's version (pyproject.toml's `version`); a source tree that was
    never installed says so rather than guessing."""
    try:
        return _dist_version("shipper")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
