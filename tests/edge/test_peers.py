"""PeerDirectory implementations: static file and the real membership service (loopback)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swactor.common.ids import load_or_create_node_id
from swactor.edge.peers import MembershipPeerDirectory, StaticPeerDirectory, load_peers_file, parse_endpoint

FP = "ab" * 32


def test_static_directory_reloads_and_validates(tmp_path: Path) -> None:
    path = tmp_path / "peers.toml"
    path.write_text(f'[[peer]]\nnode_id = 5\nendpoint = "10.0.0.5:7400"\nfingerprint = "{FP}"\n')
    d = StaticPeerDirectory(path)
    assert d.lookup(5) is not None and d.by_fingerprint(FP).node_id == 5  # type: ignore[union-attr]
    assert d.lookup(6) is None
    path.write_text(path.read_text() + f'[[peer]]\nnode_id = 6\nendpoint = "[::1]:7400"\nfingerprint = "{"cd" * 32}"\n')
    os.utime(path, (time.time() + 1, time.time() + 1))
    assert d.lookup(6) is not None
    assert parse_endpoint("[::1]:7400") == ("::1", 7400)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[peer]]\nnode_id = 1\nendpoint = "nohost"\nfingerprint = "x"\n')
    with pytest.raises(ValueError, match="not host:port"):
        load_peers_file(bad)
    bad.write_text('[[peer]]\nnode_id = 1\nendpoint = "h:1"\nfingerprint = "xyz"\n')
    with pytest.raises(ValueError, match="64 hex digits"):
        load_peers_file(bad)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_membership_directory_publishes_and_follows(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32))
    sock = tmp_path / "membership.sock"
    state = tmp_path / "state"
    node_id = load_or_create_node_id(state)  # the edge driver and membership share the node id
    log = (tmp_path / "membership.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("swactor-membership")), "--socket", str(sock), "--state-dir", str(state),
         "--bind", f"127.0.0.1:{_free_udp_port()}", "--secret-file", str(secret), "--no-gpu-autodetect"],
        stdout=log, stderr=subprocess.STDOUT,
    )

    async def main() -> None:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "membership did not start"
            await asyncio.sleep(0.05)
        d = MembershipPeerDirectory(sock)
        await d.start(self_endpoint="127.0.0.1:7400", self_fingerprint=FP)
        try:
            while time.monotonic() < deadline:
                peer = d.lookup(node_id)
                if peer is not None and peer.fingerprint == FP:
                    break
                await asyncio.sleep(0.05)
            assert d.lookup(node_id) is not None
            assert d.lookup(node_id).endpoint == "127.0.0.1:7400"  # type: ignore[union-attr]
            assert d.by_fingerprint(FP).node_id == node_id  # type: ignore[union-attr]
        finally:
            await d.close()

    try:
        asyncio.run(main())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        log.close()
