"""Every mode of install.sh reads its command line the same strict way (packaging/cli.sh): an option
that takes a value never takes the next option as it (`--prefix --help` is not a request for help,
and not a directory either), an empty value or one with a control character is refused, an unknown
option or a stray word is named. Each mistake is one line of error, exit status 2, and the script
stops before it has written or deleted anything; a mistake only the host shows (a directory that is
not install's to write into) is exit status 1, also before anything changes.

Run in a scratch root (scratch_root.py): were a check broken, what the script went on to do would
land in a throwaway copy of this machine.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .scratch_root import ScratchRoot, scratch_root_unavailable_reason
from .test_install_record import INSTALLER_FILES

REPO = Path(__file__).resolve().parents[2]
IP = ["--advertise-ip", "10.0.0.5"]
ORCH = [*IP, "--orchestrator"]
# Ports below it need a capability the gateway's unit does not grant (0 on some container hosts).
UNPRIVILEGED_START = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())

_skip = scratch_root_unavailable_reason()
pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(_skip is not None, reason=_skip or "")]

# (install.sh's arguments, exit status, words the error must hold)
MISTAKES = [
    (["--prefix"], 2, "unknown mode '--prefix'"),
    ([""], 2, "unknown mode ''"),
    (["dev", "--frobnicate"], 2, "dev takes no options, got '--frobnicate'"),
    (["model", "-x"], 2, "model needs a directory, got the option '-x'"),
    (["model", ""], 2, "model needs a directory, got an empty value"),
    (["model", "a", "b"], 2, "model takes one directory: 'b' is one too many"),
    (["host"], 2, "--advertise-ip is required"),
    (["host", "--advertise-ip"], 2, "--advertise-ip needs an address"),
    (["host", "--advertise-ip", ""], 2, "--advertise-ip needs an address, got an empty value"),
    (["host", "--advertise-ip", "--orchestrator"], 2, "--advertise-ip needs an address, got the option '--orchestrator'"),
    (["host", "--prefix", "--help"], 2, "--prefix needs a directory, got the option '--help'"),
    (["host", *IP, "--model", "--orchestrator"], 2, "--model needs a path, got the option '--orchestrator'"),
    (["host", *IP, "--seed", "--prefix", "/srv/x"], 2, "--seed needs HOST:PORT, got the option '--prefix'"),
    (["host", *IP, "--secret-file", ""], 2, "--secret-file needs a path, got an empty value"),
    (["host", *IP, "--wheelhouse", "--no-start"], 2, "--wheelhouse needs a directory, got the option '--no-start'"),
    (["host", *IP, "--orchestrator", "--api", "0.0.0.0:7440", "--api-cert", "-"], 2, "--api-cert needs a path, got the option '-'"),
    (["host", *IP, "--model", "a\nb.gguf"], 2, "--model $'a\\nb.gguf' holds a control character"),
    (["host", *IP, "--frobnicate"], 2, "unknown option '--frobnicate'"),
    (["host", *IP, "stray"], 2, "unexpected argument 'stray'"),
    (["host", "--advertise-ip", "host.example"], 2, "--advertise-ip 'host.example' is not an IP address"),
    (["host", *IP, "--seed", "10.0.0.2"], 2, "--seed '10.0.0.2' is not HOST:PORT"),
    (["host", *IP, "--advertise-port", "--orchestrator"], 2, "--advertise-port needs NAME=PORT, got the option"),
    (["host", *IP, "--advertise-port", "edge"], 2, "--advertise-port 'edge' is not NAME=PORT with NAME one of"),
    (["host", *IP, "--advertise-port", "edge=41234,gateway=1"], 2, "--advertise-port 'gateway=1' is not NAME=PORT"),
    (["host", *IP, "--advertise-port", "edge=70000"], 2, "--advertise-port 'edge=70000': the port must be 1..65535"),
    (["host", *IP, "--advertise-port", "control=0"], 2, "--advertise-port 'control=0': the port must be 1..65535"),
    # --public-ip / --public-port: the same options under their NAT names, checked the same way
    (["host", "--public-ip", "not-an-ip"], 2, "--advertise-ip 'not-an-ip' is not an IP address"),
    (["host", "--public-ip", "10.0.0.5", "--public-port", "edge"], 2, "--advertise-port 'edge' is not NAME=PORT"),
    (["host", *IP, "--api", "0.0.0.0:7440"], 2, "--api serves the orchestrator's API: it needs --orchestrator"),
    # --draft-model: the orchestrator's, a file of its own name
    (["host", *IP, "--draft-model", "/srv/draft.gguf"], 2, "--draft-model drafts for the orchestrator's runs, on its "
     "host: it needs --orchestrator"),
    (["host", *ORCH, "--draft-model", "--no-start"], 2, "--draft-model needs a path, got the option '--no-start'"),
    (["host", *ORCH, "--draft-model", "/srv/no such.gguf"], 1, "--draft-model '/srv/no such.gguf' is missing or empty"),
    (["host", *ORCH, "--model", "/srv/a/m.gguf", "--draft-model", "/srv/b/m.gguf"], 1,
     "--draft-model '/srv/b/m.gguf' has the served model's file name (m.gguf) but other bytes"),
    (["host", *IP, "--prefix", "/opt"], 2, "--prefix '/opt' is a top-level directory"),
    (["host", *IP, "--prefix", "opt/swactor"], 2, "--prefix 'opt/swactor' is not an absolute path"),
    (["host", *IP, "--prefix", "/opt/swactor/"], 2, "--prefix '/opt/swactor/' is not a normalized path"),
    (["host", *IP, "--prefix", "/opt/my app"], 2, "holds characters a systemd unit cannot take as they are (' ')"),
    (["host", *IP, "--prefix", "/opt/a|b&c\\d$e"], 2, "holds characters a systemd unit cannot take as they are ('|&\\$')"),
    (["host", *IP, "--prefix", "/srv/app"], 1, "--prefix '/srv/app' holds files install.sh host did not put there"),
    (["host", *IP, "--prefix", "/srv/opt-link"], 1, "--prefix '/srv/opt-link' is not a directory"),
    (["host", *IP, "--secret-file", "/srv/no such file"], 1, "--secret-file '/srv/no such file' is missing or empty"),
    # --gateway: the OpenAI API, beside the orchestrator, on a port of its own, TLS off loopback.
    (["host", *IP, "--gateway", "127.0.0.1:8000"], 2, "--gateway serves the pool's OpenAI API through the orchestrator "
     "on this host: it needs --orchestrator"),
    (["host", *ORCH, "--gateway"], 2, "--gateway needs HOST:PORT"),
    (["host", *ORCH, "--gateway", "--api", "0.0.0.0:7440"], 2, "--gateway needs HOST:PORT, got the option '--api'"),
    (["host", *ORCH, "--gateway", "8000"], 2, "--gateway '8000' is not HOST:PORT"),
    (["host", *ORCH, "--gateway", "http://127.0.0.1:8000"], 2, "--gateway 'http://127.0.0.1:8000' is not HOST:PORT"),
    (["host", *ORCH, "--gateway", "0.0.0.0:65536"], 2, "--gateway '0.0.0.0:65536': the port must be 1..65535"),
    (["host", *ORCH, "--gateway", "0.0.0.0:7441"], 2, "port 7441 is taken on this host by the worker's stage control"),
    (["host", *ORCH, "--api", "0.0.0.0:7440", "--gateway", "127.0.0.1:7440"], 2,
     "port 7440 is taken on this host by the orchestrator's API (--api)"),
    (["host", *ORCH, "--gateway-cert", "/etc/hostname", "--gateway-key", "/etc/hostname"], 2,
     "--gateway-cert/--gateway-key are for the gateway: add --gateway HOST:PORT"),
    (["host", *ORCH, "--gateway", "0.0.0.0:8443", "--gateway-cert", "/etc/hostname"], 2, "--gateway-cert needs --gateway-key"),
    (["host", *ORCH, "--gateway", "0.0.0.0:8443", "--gateway-key", "/etc/hostname"], 2, "--gateway-key needs --gateway-cert"),
    (["host", *ORCH, "--gateway-name", "gw.example"], 2, "--gateway-name names the gateway's certificate: add --gateway"),
    (["host", *ORCH, "--gateway", "127.0.0.1:8000", "--gateway-name", "gw.example"], 2,
     "--gateway-name: --gateway '127.0.0.1:8000' is loopback, served as plain HTTP without a certificate"),
    (["host", *ORCH, "--gateway", "0.0.0.0:8443", "--gateway-name", "gw.example", "--gateway-cert", "/etc/hostname",
      "--gateway-key", "/etc/hostname"], 2, "--gateway-cert brings its own names"),
    (["host", *ORCH, "--gateway", "0.0.0.0:8443", "--gateway-cert", "/srv/no cert", "--gateway-key", "/etc/hostname"], 1,
     "--gateway-cert '/srv/no cert' is missing or empty"),
    *([(["host", *ORCH, "--gateway", "0.0.0.0:443"], 1, "--gateway '0.0.0.0:443': port 443 is privileged on this host")]
      if UNPRIVILEGED_START > 443 else []),
    (["uninstall", "--prefix"], 2, "--prefix needs a directory"),
    (["uninstall", "--purge"], 2, "unknown option '--purge'"),
    (["uninstall", "stray"], 2, "unexpected argument 'stray'"),
]


@pytest.fixture(scope="module")
def root() -> Iterator[ScratchRoot]:
    with ScratchRoot() as root:
        for rel in INSTALLER_FILES:
            dest = root.path(f"/root/swactor/{rel}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest)
        root.sh("mkdir -p /srv/app /srv/a /srv/b && echo mine > /srv/app/data && ln -s /opt /srv/opt-link"
                " && echo a > /srv/a/m.gguf && echo b > /srv/b/m.gguf", check=True)
        yield root


@pytest.mark.parametrize(("args", "status", "words"), MISTAKES, ids=[" ".join(m[0]) or "''" for m in MISTAKES])
def test_a_mistake_is_named_before_anything_changes(root: ScratchRoot, args: list[str], status: int, words: str) -> None:
    before = root.snapshot()
    done = root.run(["bash", "/root/swactor/install.sh", *args], timeout=30)
    lines = done.stderr.splitlines()
    assert done.returncode == status and len(lines) == 1, (done.returncode, done.stderr)
    assert re.match(r"\[(install|install host|uninstall)\] error: ", lines[0]) and words in lines[0], lines[0]
    assert done.stdout == ""
    assert root.changes(before) == {}


@pytest.mark.parametrize(("args", "words"), [(["host", "--help"], "--prefix DIR"), (["host", *IP, "-h"], "--api HOST:PORT"),
                                             (["host", "--help"], "--gateway HOST:PORT"),
                                             (["host", "--help"], "--draft-model PATH"),
                                             (["uninstall", "--help"], "--purge-secret"), (["model", "--help"], "install.sh model")])
def test_help_is_help_only_where_it_is_not_a_value(root: ScratchRoot, args: list[str], words: str) -> None:
    before = root.snapshot()
    done = root.run(["bash", "/root/swactor/install.sh", *args], timeout=30)
    assert done.returncode == 0 and words in done.stdout, (done.returncode, done.stdout, done.stderr)
    assert root.changes(before) == {}
