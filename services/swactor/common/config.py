"""One TOML file per host (default /etc/swactor/swactor.toml), one table per service.

Each service declares its settings as a dataclass; `load_section` fills it from the file and
refuses unknown keys or wrong types by name, so a typo never silently becomes a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

DEFAULT_CONFIG_PATH = Path("/etc/swactor/swactor.toml")
DEFAULT_STATE_DIR = Path("/var/lib/swactor")
DEFAULT_RUN_DIR = Path("/run/swactor")

T = TypeVar("T")


class ConfigError(ValueError):
    """The config file is unreadable or a key is unknown or of the wrong type."""


def read_config(path: Path | None) -> dict[str, Any]:
    """The parsed file, or {} when no path is given and the default file does not exist."""
    if path is None:
        if not DEFAULT_CONFIG_PATH.exists():
            return {}
        path = DEFAULT_CONFIG_PATH
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from None


def _coerce(name: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(hint):
            if arm is type(None) and value is None:
                return None
            try:
                return _coerce(name, arm, value)
            except ConfigError:
                continue
        raise ConfigError(f"{name}: {value!r} is not a {hint}")
    if hint is Path:
        if isinstance(value, Path):
            return value
        if isinstance(value, str):
            return Path(value)
        raise ConfigError(f"{name}: expected a path string, got {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_coerce(f"{name}[{i}]", item, v) for i, v in enumerate(value)]
    if isinstance(hint, type) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        raise ConfigError(f"{name}: expected {hint.__name__}, got {value!r}")
    return value


def load_section(config: dict[str, Any], section: str, cls: type[T], **overrides: Any) -> T:
    """Build `cls` (a dataclass) from table `section`, then apply non-None `overrides` (CLI flags)."""
    table = dict(config.get(section, {}))
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] must be a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - fields)
    if unknown:
        raise ConfigError(f"[{section}]: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    table.update({k: v for k, v in overrides.items() if v is not None})
    values = {k: _coerce(f"[{section}].{k}", hints[k], v) for k, v in table.items()}
    return cls(**values)
