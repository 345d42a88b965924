from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.ids import load_or_create_node_id


@dataclass
class Example:
    socket: Path = Path("/run/x.sock")
    ceiling_bytes: int = 10
    ratio: float = 1.0
    seeds: list[str] | None = None


def test_section_fills_dataclass_and_overrides_win() -> None:
    cfg = {"ex": {"socket": "/tmp/a.sock", "ratio": 2, "seeds": ["a:1"]}}
    got = load_section(cfg, "ex", Example, ceiling_bytes=7, ratio=None)
    assert got == Example(socket=Path("/tmp/a.sock"), ceiling_bytes=7, ratio=2.0, seeds=["a:1"])
    assert load_section(cfg, "ex", Example, socket=Path("/x.sock")).socket == Path("/x.sock")


@pytest.mark.parametrize(
    ("table", "needle"),
    [({"sockett": "x"}, "unknown key(s) sockett"), ({"ceiling_bytes": "big"}, "ceiling_bytes"),
     ({"ceiling_bytes": True}, "ceiling_bytes"), ({"seeds": "a"}, "seeds")],
)
def test_bad_keys_are_named(table: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_section({"ex": table}, "ex", Example)


def test_read_config_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("x = [")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        read_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        read_config(tmp_path / "missing.toml")


def test_node_id_is_stable_and_validated(tmp_path: Path) -> None:
    first = load_or_create_node_id(tmp_path)
    assert first == load_or_create_node_id(tmp_path)
    (tmp_path / "node_id").write_text("nope")
    with pytest.raises(ValueError, match="not an integer"):
        load_or_create_node_id(tmp_path)
