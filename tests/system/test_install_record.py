"""The install record: `bash install.sh uninstall` removes what `install.sh host` recorded and nothing
else, and `install.sh host` writes only into an install root that is new, empty or its own. Run for
real, `rm -rf` and all, in a scratch root (a throwaway overlay of this machine's /, scratch_root.py),
over a host that carries what an orchestrator install leaves (its record written by the installer's
own packaging/record.sh) and an operator's files planted beside it.

A --prefix that is not the install root (/, /opt, /home, /root, /boot, /srv, /usr, ., .., --help, a
relative path, a path with .. in it, a link to /opt, a directory without install's marker, a copy of
the install root, one other than the record's) is refused with one line naming --prefix, and the
refused run writes and deletes nothing anywhere. An accepted run removes the recorded things only:
the planted files survive, an operator's file in the install root too; the secret and the models
stay until purged; the swactor user's stray processes are ended; a second run is a no-op. An install
with --gateway over a kept config takes that config's [gateway] table only where it says what the
options say.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .scratch_root import ScratchRoot, scratch_root_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
INSTALLER_FILES = ["install.sh", "packaging/cli.sh", "packaging/record.sh", "packaging/encode.sh",
                   "packaging/install-host.sh", "packaging/uninstall-host.sh"]
UNITS = ["swactor.target", "swactor-membership.service", "swactor-arena.service", "swactor-edge.service",
         "swactor-worker.service", "swactor-orchestrator.service", "swactor-gateway.service"]

_skip = scratch_root_unavailable_reason()
pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(_skip is not None, reason=_skip or "")]

# What `install.sh host --orchestrator` leaves on a host, made without its slow half (pip, the model
# fetch, starting the services); the record and the marker come from the installer's own code. Its
# arguments: the unit files.
FAKE_INSTALL = r"""
. /root/swactor/packaging/record.sh
REC_LINES=()
prefix=/opt/swactor
units=("$@")
record="$(install_record_lines "$prefix" "${units[@]}" | record_text)"
install -d -m 0755 "$prefix"
install -d -m 0750 /etc/swactor
printf '%s\n' "$record" > "$prefix/.swactor-install"
printf '%s\n' "$record" > /etc/swactor/installed
groupadd --system swactor
useradd --system --gid swactor --home-dir /var/lib/swactor --no-create-home --shell /usr/sbin/nologin swactor
mkdir -p "$prefix/venv/bin" "$prefix/docs"
printf '#!/bin/sh\n' > "$prefix/venv/bin/swactor" && chmod +x "$prefix/venv/bin/swactor"
echo "# operations" > "$prefix/docs/operations.md"
ln -sfn "$prefix/venv/bin/swactor" /usr/local/bin/swactor
for unit in "${units[@]}"; do sed "s|/opt/swactor|$prefix|g" "/root/swactor/systemd/$unit" > "/etc/systemd/system/$unit"; done
echo 00112233 > /etc/swactor/cluster.secret
echo "[membership]" > /etc/swactor/swactor.toml
install -d /etc/swactor/api && echo token > /etc/swactor/api/token
install -d /etc/swactor/gateway && echo token > /etc/swactor/gateway/token
install -d -o swactor -g swactor /var/lib/swactor /var/lib/swactor/edge /var/cache/swactor /run/swactor
echo 7 > /var/lib/swactor/node_id
install -d /var/lib/swactor/models && echo gguf > /var/lib/swactor/models/model.gguf
"""

# An operator's files: in the directories a careless --prefix names, beside the install root, and
# under names that start like swactor's. PLANT's arguments: PLANTED.
PLANTED = ["/opt/keep-me", "/opt/other-app/data", "/opt/swactor-notes", "/home/keep-me", "/root/keep-me",
           "/boot/keep-me", "/srv/keep-me", "/srv/app/keep-me", "/usr/keep-me", "/usr/local/keep-me",
           "/usr/local/bin/other-tool", "/etc/keep-me", "/etc/systemd/system/other.service",
           "/var/lib/other/keep-me", "/var/lib/swactor-other/keep-me", "/var/keep-me"]
PLANT = r"""
for f in "$@"; do mkdir -p "$(dirname "$f")" && echo "$f" > "$f"; done
ln -s /opt /srv/opt-link
cp -a /opt/swactor /srv/copy
"""

# What an uninstall may remove or change: swactor's own paths, and the account files userdel rewrites.
SWACTOR_OWN = re.compile(r"(/opt/swactor|/etc/systemd/system/swactor[^/]*|/etc/systemd/system/[^/]+\.wants"
                         r"|/usr/local/bin/swactor|/etc/swactor|/var/lib/swactor|/var/cache/swactor|/run/swactor)"
                         r"(/.*)?")
ACCOUNT_FILES = re.compile(r"/etc/(passwd|group|shadow|gshadow|subuid|subgid)-?")


@pytest.fixture
def host() -> Iterator[ScratchRoot]:
    """A scratch root holding the installer's scripts, an install's leavings and the planted files."""
    with ScratchRoot() as root:
        for rel in [*INSTALLER_FILES, *(f"systemd/{u}" for u in UNITS)]:
            dest = root.path(f"/root/swactor/{rel}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest)
        root.sh(FAKE_INSTALL, *UNITS, check=True)
        root.sh(PLANT, *PLANTED, check=True)
        yield root


def uninstall(root: ScratchRoot, *args: str, cwd: str = "/root"):
    return root.run(["bash", "/root/swactor/install.sh", "uninstall", *args], cwd=cwd)


def assert_planted_intact(root: ScratchRoot) -> None:
    for f in PLANTED:
        assert root.path(f).read_text() == f + "\n", f"{f} was touched"
    assert root.path("/srv/opt-link").is_symlink()
    assert root.path("/srv/copy/.swactor-install").is_file() and root.path("/srv/copy/venv/bin/swactor").is_file()


def assert_refused(root: ScratchRoot, done, status: int, words: str) -> None:
    """A one-line error naming what was wrong, the status for it, and nothing touched anywhere."""
    lines = done.stderr.splitlines()
    assert done.returncode == status and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("[uninstall] error: ") and words in lines[0], lines[0]
    assert_planted_intact(root)


# (--prefix value, exit status, words the error must hold). 2: the command line alone is wrong; 1: the
# directory is not proven swactor's install root.
NOT_THE_INSTALL_ROOT = [
    ("/", 2, "is a top-level directory"), ("/opt", 2, "is a top-level directory"),
    ("/home", 2, "is a top-level directory"), ("/root", 2, "is a top-level directory"),
    ("/boot", 2, "is a top-level directory"), ("/srv", 2, "is a top-level directory"),
    ("/usr", 2, "is a top-level directory"), (".", 2, "is not an absolute path"), ("..", 2, "is not an absolute path"),
    ("opt/swactor", 2, "is not an absolute path"), ("/opt/swactor/../..", 2, "is not a normalized path"),
    ("/opt/swactor/..", 2, "is not a normalized path"), ("/opt//swactor", 2, "is not a normalized path"),
    ("--help", 2, "--prefix needs a directory, got the option '--help'"),
    ("", 2, "--prefix needs a directory, got an empty value"),
    ("/opt/my app", 2, "holds characters a systemd unit cannot take"),
    ("/srv/opt-link", 1, "--prefix"), ("/srv/app", 1, "--prefix"), ("/srv/copy", 1, "--prefix"),
    ("/usr/local", 1, "--prefix"), ("/srv/missing", 1, "--prefix"),
]


@pytest.mark.parametrize("record", ["record", "no-record"])
@pytest.mark.parametrize(("prefix", "status", "words"), NOT_THE_INSTALL_ROOT, ids=lambda v: repr(v) if isinstance(v, str) else "")
def test_a_prefix_that_is_not_the_install_root_is_refused(host: ScratchRoot, record: str, prefix: str,
                                                          status: int, words: str) -> None:
    if record == "no-record":  # a lost record: --prefix is all there is to go by
        host.run(["rm", "/etc/swactor/installed"], check=True)
    before = host.snapshot()
    done = uninstall(host, "--prefix", prefix, cwd="/srv/app")  # "." and ".." name /srv/app and /srv
    assert_refused(host, done, status, words)
    assert host.changes(before) == {}


def test_the_record_names_what_is_removed_and_nothing_else(host: ScratchRoot) -> None:
    # A stray process of the service user (started outside the units) is ended first.
    host.sh("setsid runuser -u swactor -- sleep 300 </dev/null >/dev/null 2>&1 &", check=True)
    before = host.snapshot()
    done = uninstall(host)
    assert done.returncode == 0, done.stderr
    assert "ending the swactor processes left outside the units" in done.stderr
    changed = host.changes(before)
    assert {p for p in changed if not SWACTOR_OWN.fullmatch(p) and not ACCOUNT_FILES.fullmatch(p)} == set(), changed
    assert_planted_intact(host)
    for gone in ["/opt/swactor", "/usr/local/bin/swactor", "/var/cache/swactor", "/run/swactor",
                 *(f"/etc/systemd/system/{u}" for u in UNITS)]:
        assert not host.path(gone).exists() and not host.path(gone).is_symlink(), gone
    # Kept until purged, root's now: the secret and the models; nothing else of the config or the state.
    assert sorted(p.name for p in host.path("/etc/swactor").iterdir()) == ["cluster.secret"]
    assert sorted(str(p.relative_to(host.path("/var/lib/swactor"))) for p in host.path("/var/lib/swactor").rglob("*")) \
        == ["models", "models/model.gguf"]
    assert host.run(["getent", "passwd", "swactor"]).returncode == 2
    assert host.run(["getent", "group", "swactor"]).returncode == 2
    assert host.sh("ps -eo user= | grep -cx swactor || true").stdout.strip() == "0"

    # A second run: no record now; what the first kept goes when purged, and a third finds nothing.
    done = uninstall(host, "--purge-secret", "--purge-model")
    assert done.returncode == 0, done.stderr
    assert not host.path("/etc/swactor").exists() and not host.path("/var/lib/swactor").exists()
    before = host.snapshot()
    done = uninstall(host)
    assert done.returncode == 0 and "nothing of swactor is left" in done.stderr, done.stderr
    assert host.changes(before) == {}
    assert_planted_intact(host)


def test_an_operators_file_in_the_install_root_is_kept(host: ScratchRoot) -> None:
    host.path("/opt/swactor/notes.txt").write_text("mine\n")
    done = uninstall(host, "--prefix", "/opt/swactor")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in host.path("/opt/swactor").iterdir()) == ["notes.txt"]
    assert "kept: /opt/swactor/ (files install did not put there)" in done.stderr


@pytest.mark.parametrize("prefix_option", [[], ["--prefix", "/opt/swactor"]], ids=["default", "prefix"])
def test_without_a_record_the_marker_stands_for_it(host: ScratchRoot, prefix_option: list[str]) -> None:
    host.run(["rm", "/etc/swactor/installed"], check=True)
    done = uninstall(host, *prefix_option)
    assert done.returncode == 0, done.stderr
    assert not host.path("/opt/swactor").exists()
    assert not any(host.path(f"/etc/systemd/system/{u}").exists() for u in UNITS)
    assert host.run(["getent", "passwd", "swactor"]).returncode == 2
    assert_planted_intact(host)


def test_an_older_installers_record_removes_only_what_that_version_made(host: ScratchRoot) -> None:
    # install.sh before the marker recorded `PREFIX=DIR` only: its venv and docs go, the root stays.
    host.run(["rm", "/opt/swactor/.swactor-install"], check=True)
    host.path("/etc/swactor/installed").write_text("PREFIX=/opt/swactor\n")
    done = uninstall(host)
    assert done.returncode == 0, done.stderr
    assert list(host.path("/opt/swactor").iterdir()) == []
    assert not any(host.path(f"/etc/systemd/system/{u}").exists() for u in UNITS)
    assert_planted_intact(host)


# Records uninstall must not act on: an edited line, an older installer's record naming /opt, a
# marker that is not the record's copy.
UNTRUSTED = [
    ("echo 'tree /opt' >> /etc/swactor/installed", "has a line install.sh host does not write: 'tree /opt'"),
    ("echo 'PREFIX=/opt' > /etc/swactor/installed", "names the install root '/opt', which is a top-level directory"),
    ("echo 'PREFIX=/srv/app' > /etc/swactor/installed", "holds no .swactor-install"),
    ("sed -i 's|^prefix .*|prefix /srv/app|' /etc/swactor/installed", "has a line install.sh host does not write"),
    ("echo 'user root' >> /opt/swactor/.swactor-install", "differs from /etc/swactor/installed"),
    ("rm /opt/swactor/.swactor-install", "holds no .swactor-install"),
]


@pytest.mark.parametrize(("edit", "words"), UNTRUSTED)
def test_a_record_install_did_not_write_is_refused(host: ScratchRoot, edit: str, words: str) -> None:
    host.sh(edit, check=True)
    before = host.snapshot()
    done = uninstall(host)
    assert_refused(host, done, 1, words)
    assert host.changes(before) == {}


# install.sh host's choice of install root, probed without installing: the copy has no runuser, so
# an install that accepts its root stops right after, at "runuser not found", having changed nothing.
INSTALL_ROOTS = {  # what was done to the host, --prefix, the refusal (None: accepted)
    "its-own-root-again": ("", "/opt/swactor", None),
    "record-lost-marker-stands": ("rm /etc/swactor/installed", "/opt/swactor", None),
    "older-installer": ("rm /opt/swactor/.swactor-install; echo PREFIX=/opt/swactor > /etc/swactor/installed",
                        "/opt/swactor", None),
    "empty-directory": ("rm -r /etc/swactor /opt/swactor; mkdir /opt/swactor", "/opt/swactor", None),
    "other-than-recorded": ("", "/srv/other", "--prefix '/srv/other': swactor is installed in /opt/swactor on this host"),
    "a-moved-copy": ("rm /etc/swactor/installed; mv /opt/swactor /opt/moved", "/opt/moved",
                     "--prefix '/opt/moved' holds the .swactor-install of another install root"),
    "no-marker": ("rm /opt/swactor/.swactor-install", "/opt/swactor",
                  "--prefix '/opt/swactor' holds files install.sh host did not put there (it has no .swactor-install)"),
}


@pytest.mark.parametrize(("edit", "prefix", "refusal"), INSTALL_ROOTS.values(), ids=INSTALL_ROOTS.keys())
def test_install_writes_only_into_a_root_that_is_new_empty_or_its_own(host: ScratchRoot, edit: str, prefix: str,
                                                                       refusal: str | None) -> None:
    host.sh(f"{edit}\nrm /usr/sbin/runuser", check=True)
    before = host.snapshot()
    done = host.run(["bash", "/root/swactor/install.sh", "host", "--advertise-ip", "10.0.0.5", "--prefix", prefix])
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert (refusal or "runuser not found") in lines[0], lines[0]
    assert host.changes(before) == {}


# --gateway on a host installed before: its swactor.toml is kept, and a [gateway] table in it too, but only where
# that table says what the options say (else the gateway would serve another address, or a network address without
# TLS); a config without the table is accepted (the install adds the table later on). Probed as above.
GATEWAY_TABLES = {  # the [gateway] table of the kept swactor.toml, --gateway, the refusal (None: accepted)
    "none-yet": ("", "127.0.0.1:8000", None),
    "the-same-with-more": ('[ gateway ]  # mine\ntoken_file = "/etc/swactor/gateway/token"\naddress="127.0.0.1:8000"\n'
                           "max_concurrent = 8\n", "127.0.0.1:8000", None),
    "another-address": ('[gateway]\naddress = "127.0.0.1:9000"\ntoken_file = "/etc/swactor/gateway/token"\n',
                        "127.0.0.1:8000", '--gateway: the [gateway] table of the existing /etc/swactor/swactor.toml says '
                        'address="127.0.0.1:9000" token_file="/etc/swactor/gateway/token" where these options say '
                        'address="127.0.0.1:8000" token_file="/etc/swactor/gateway/token"; edit it'),
    "network-without-tls": ('[gateway]\naddress = "0.0.0.0:8443"\ntoken_file = "/etc/swactor/gateway/token"\n',
                            "0.0.0.0:8443", 'where these options say address="0.0.0.0:8443" '
                            'tls_cert="/etc/swactor/gateway/cert.pem" tls_key="/etc/swactor/gateway/key.pem"'),
}


@pytest.mark.parametrize(("table", "gateway", "refusal"), GATEWAY_TABLES.values(), ids=GATEWAY_TABLES.keys())
def test_a_kept_config_serves_the_gateway_the_options_ask_for(host: ScratchRoot, table: str, gateway: str,
                                                               refusal: str | None) -> None:
    with host.path("/etc/swactor/swactor.toml").open("a") as config:
        config.write(f"\n{table}")
    host.sh("rm /usr/sbin/runuser", check=True)
    before = host.snapshot()
    done = host.run(["bash", "/root/swactor/install.sh", "host", "--advertise-ip", "10.0.0.5", "--orchestrator",
                     "--gateway", gateway])
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert (refusal or "runuser not found") in lines[0], lines[0]
    assert host.changes(before) == {}


# What `install.sh host --no-systemd` leaves beside the rest (its record from the installer's own code): the units
# in the install root for the supervisor, its link, log and runtime dir, and a running supervisor (a stand-in that
# does not answer on a control socket: the uninstall falls back to SIGTERM to the pid in its pid file).
FAKE_SUPERVISED = r"""
. /root/swactor/packaging/record.sh
record_read /etc/swactor/installed
record="$(install_record_lines --no-systemd /opt/swactor swactor-membership.service | record_text)"
printf '%s\n' "$record" > /opt/swactor/.swactor-install
printf '%s\n' "$record" > /etc/swactor/installed
install -d /opt/swactor/units /run/swactor-host
cp /root/swactor/systemd/swactor-membership.service /opt/swactor/units/
printf '#!/bin/sh\n' > /opt/swactor/venv/bin/swactor-host
ln -sfn /opt/swactor/venv/bin/swactor-host /usr/local/bin/swactor-host
echo '{"event": "started"}' > /var/log/swactor-host.log
setsid bash -c 'exec -a swactor-host sleep 300' </dev/null >/dev/null 2>&1 &
echo $! > /run/swactor-host/pid
"""


def test_a_host_without_systemd_loses_its_supervisor_and_its_files(host: ScratchRoot) -> None:
    host.sh(FAKE_SUPERVISED, check=True)
    lines = set(host.path("/etc/swactor/installed").read_text().splitlines())
    assert {"tree /opt/swactor/units", "link /usr/local/bin/swactor-host", "file /var/log/swactor-host.log",
            "dir /run/swactor-host"} <= lines
    pid = host.path("/run/swactor-host/pid").read_text().strip()
    done = uninstall(host)
    assert done.returncode == 0, done.stderr
    assert f"stopping the supervisor swactor-host (pid {pid})" in done.stderr, done.stderr
    assert host.sh("ps -eo args= | grep -c '^swactor-host' || true").stdout.strip() == "0"
    for gone in ["/opt/swactor", "/usr/local/bin/swactor-host", "/var/log/swactor-host.log", "/run/swactor-host"]:
        assert not host.path(gone).exists() and not host.path(gone).is_symlink(), gone
    assert_planted_intact(host)


# The orchestrator's drop-in for a draft model (install.sh host --draft-model) is install's own file, in the record:
# the uninstall removes it, and its directory unless an operator's drop-in is in it too.
ADD_DRAFT_DROPIN = r"""
. /root/swactor/packaging/record.sh
for f in /etc/swactor/installed /opt/swactor/.swactor-install; do echo "dropin $DRAFT_DROPIN" >> "$f"; done
mkdir -p "$(dirname "$DRAFT_DROPIN")" && echo '[Service]' > "$DRAFT_DROPIN"
"""


@pytest.mark.parametrize("operators", [False, True], ids=["alone", "beside-the-operators"])
def test_the_draft_model_drop_in_goes_with_the_uninstall(host: ScratchRoot, operators: bool) -> None:
    host.sh(ADD_DRAFT_DROPIN, check=True)
    dropins = host.path("/etc/systemd/system/swactor-orchestrator.service.d")
    if operators:
        (dropins / "limits.conf").write_text("[Service]\nMemoryMax=8G\n")
    done = uninstall(host)
    assert done.returncode == 0, done.stderr
    assert not (dropins / "swactor-draft-model.conf").exists()
    if operators:
        assert [p.name for p in dropins.iterdir()] == ["limits.conf"]
        assert "/etc/systemd/system/swactor-orchestrator.service.d/ (drop-ins)" in done.stderr, done.stderr
    else:
        assert not dropins.exists()
        assert "(drop-ins)" not in done.stderr
    assert_planted_intact(host)


# --draft-model on a host installed before: the kept swactor.toml must already name that draft model (it is
# the operator's file; a draft model it does not name would be copied and never used). Probed as above.
DRAFT_MODEL_LINES = {  # the line added to the kept config's [orchestrator] table, the refusal (None: accepted)
    "named": ('draft_model = "/var/lib/swactor/models/draft.gguf"', None),
    "not-named": ("", "--draft-model: the existing /etc/swactor/swactor.toml names no draft_model "
                      "/var/lib/swactor/models/draft.gguf; add that line to its [orchestrator] table"),
    "another": ('draft_model = "/var/lib/swactor/models/other.gguf"', "names no draft_model"),
}


@pytest.mark.parametrize(("line", "refusal"), DRAFT_MODEL_LINES.values(), ids=DRAFT_MODEL_LINES.keys())
def test_a_kept_config_must_name_the_draft_model(host: ScratchRoot, line: str, refusal: str | None) -> None:
    host.path("/etc/swactor/swactor.toml").write_text(f"[orchestrator]\n{line}\n")
    host.sh("echo gguf > /srv/draft.gguf && rm /usr/sbin/runuser", check=True)
    before = host.snapshot()
    done = host.run(["bash", "/root/swactor/install.sh", "host", "--advertise-ip", "10.0.0.5", "--orchestrator",
                     "--draft-model", "/srv/draft.gguf"])
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert (refusal or "runuser not found") in lines[0], lines[0]
    assert host.changes(before) == {}
