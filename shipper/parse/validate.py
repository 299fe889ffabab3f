"""Does each input's parsing config build? `pattern` into a `RegexParser`, `mask`, `rename_fields`
and `drop_fields` into a `DocTransform`: the checks `shipper.config` cannot make without knowing
the parsers. Run after `config.load_config` by `shipper.settings.load`; raises the same
`ConfigError(key, message, file, line)` the loader does, the line taken from `Config.key_lines`.
"""

from __future__ import annotations

from shipper.config import Config, InputConfig
from shipper.config_values import line_of
from shipper.errors import ConfigError
from shipper.parse.filters import DocTransform
from shipper.parse.regex import RegexParser

__all__ = ["check_inputs"]


def check_inputs(cfg: Config) -> None:
    """Raises ConfigError for the first input whose pattern or field filters cannot be built."""
    for i, inp in enumerate(cfg.inputs):
        problem = input_problem(inp)
        if problem is not None:
            key = f"inputs[{i}].{problem[0]}"
            raise ConfigError(key, problem[1], cfg.source, line_of(cfg.key_lines, key))


def input_problem(inp: InputConfig) -> tuple[str, str] | None:
    """(the input's key at fault, what is wrong), or None when its parsers build."""
    if inp.format == "regex" and inp.pattern:
        try:
            RegexParser(inp.pattern, "UTC")
        except ValueError as e:
            return "pattern", str(e)
    if inp.mask or inp.rename_fields or inp.drop_fields:
        try:
            DocTransform(inp.drop_fields, inp.rename_fields, inp.mask)
        except ValueError as e:
            return "mask", str(e)
    return None
