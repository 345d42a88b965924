"""The installer writes operator-given paths into other languages (packaging/encode.sh): a model path
into swactor.toml as a TOML basic string, a wheelhouse path into PIP_FIND_LINKS as a file: URL. A
path holding a space, a quote, a backslash or a dollar sign comes back out as the same path: TOML
reads the same string, pip finds the wheels (it would split a plain path at its space).

The functions run in bash as install-host.sh runs them; sourcing encode.sh changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import urllib.parse
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ODD_PATHS = [
    "/var/lib/swactor/models/plain.gguf",
    "/var/lib/swactor/models/my model.gguf",
    "/var/lib/swactor/models/it's \"the\" model.gguf",
    "/var/lib/swactor/models/back\\slash\\\\two.gguf",
    "/var/lib/swactor/models/$HOME and `date` and $(id).gguf",
    "/var/lib/swactor/models/ünïcødé # not a comment = x.gguf",
    "/var/lib/swactor/models/trailing backslash\\",
]


def encode(function: str, *args: str) -> str:
    done = subprocess.run(["bash", "-c", f'. "$0" && {function} "$@"', str(REPO / "packaging" / "encode.sh"), *args],
                          capture_output=True, text=True, check=True, timeout=10)
    return done.stdout


@pytest.mark.parametrize("path", ODD_PATHS)
def test_toml_reads_back_the_model_path(path: str) -> None:
    line = encode("toml", "model_path", path)
    assert line.count("\n") == 1, line
    assert tomllib.loads(line) == {"model_path": path}, line


@pytest.mark.parametrize("path", ODD_PATHS)
def test_the_wheelhouse_url_is_one_word_naming_the_path(path: str) -> None:
    url = encode("file_url", path)
    assert url.startswith("file:///") and len(url.split()) == 1, url
    assert urllib.parse.unquote(urllib.parse.urlsplit(url).path) == path


def test_pip_finds_wheels_in_a_wheelhouse_with_odd_characters(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheel house 'q' \"d\" $x"
    wheelhouse.mkdir()
    dist_info = "swactor_probe-1.0.dist-info"
    with zipfile.ZipFile(wheelhouse / "swactor_probe-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("swactor_probe.py", "")
        whl.writestr(f"{dist_info}/METADATA", "Metadata-Version: 2.1\nName: swactor-probe\nVersion: 1.0\n")
        whl.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist_info}/RECORD", "")
    # As install-host.sh passes it: the URL in PIP_FIND_LINKS, no index.
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": encode("file_url", str(wheelhouse)),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp_path / "got"),
                           "swactor-probe"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == ["swactor_probe-1.0-py3-none-any.whl"]
