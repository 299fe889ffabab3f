"""The one way to load a config for running: `config.load_config` (YAML -> dataclasses), then
`parse.validate.check_inputs` (do the patterns and field filters build?). Every command and the
daemon's reload load through here; `shipper.config` alone stays free of `shipper.parse`.
"""

from __future__ import annotations

from collections.abc import Mapping

from shipper.config import Config, load_config, load_config_text
from shipper.parse.validate import check_inputs

__all__ = ["allow_insecure_config", "load", "load_text"]

_allow_insecure = False


def allow_insecure_config(allowed: bool = True) -> bool:
    """`--allow-insecure-config`: from now on in this process (the SIGHUP reloads too), root loads
    a config file other users may write. Returns what was set before."""
    global _allow_insecure
    before, _allow_insecure = _allow_insecure, allowed
    return before


def load(path: str, env: Mapping[str, str] | None = None) -> Config:
    """Read, parse and validate the config file at `path`. Raises ConfigError naming the key."""
    cfg = load_config(path, env, allow_insecure=_allow_insecure)
    check_inputs(cfg)
    return cfg


def load_text(text: str, file: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """`load` for text already in hand; `file` names it in errors."""
    cfg = load_config_text(text, file, env)
    check_inputs(cfg)
    return cfg
