"""Two-process ring harness: SCM_RIGHTS hand-over of an arena memfd and a ring's eventfds.

Imported by the tests (via conftest) and run as the child process:
`python ringproc.py <role> <socket-fd>`. The parent sends, over a socketpair,
`[memfd, readable_fd, writable_fd]` plus a JSON description of the arena and ring;
the child maps the arena once, opens its side of the ring and reports a JSON result.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import swactor_ring as sr

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Handover:
    arena: sr.Arena
    layout: sr.RingLayout
    readable_fd: int
    writable_fd: int
    params: dict[str, Any]


def layout_dict(layout: sr.RingLayout) -> dict[str, int]:
    return {
        k: getattr(layout, k)
        for k in (
            "ring_id",
            "arena_offset",
            "total_len",
            "header_offset",
            "data_offset",
            "data_capacity",
            "alignment",
        )
    }


def send_ring(
    sock: socket.socket,
    arena_fd: int,
    arena_size: int,
    rings: list[tuple[sr.RingLayout, int, int]],
    params: dict[str, Any],
) -> None:
    """Send the arena fd and, per ring, (layout, readable_fd, writable_fd)."""
    fds = [arena_fd]
    for _, rfd, wfd in rings:
        fds += [rfd, wfd]
    meta = {"arena_size": arena_size, "layouts": [layout_dict(lay) for lay, _, _ in rings], "params": params}
    socket.send_fds(sock, [json.dumps(meta).encode()], fds)


def recv_ring(sock: socket.socket) -> tuple[sr.Arena, list[Handover]]:
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 32)
    meta = json.loads(msg)
    arena = sr.Arena.from_fd(fds[0], meta["arena_size"])
    os.close(fds[0])  # the mapping does not need the fd
    out = []
    for i, ld in enumerate(meta["layouts"]):
        out.append(Handover(arena, sr.RingLayout(**ld), fds[1 + 2 * i], fds[2 + 2 * i], meta["params"]))
    return arena, out


def pattern(size: int, seed: int) -> bytes:
    """Deterministic pseudo-random bytes, twice over so any window of `size` bytes is a slice."""
    import random

    block = random.Random(seed).randbytes(size)
    return block + block


def _consume_stream(h: Handover) -> dict[str, Any]:
    import random

    c = sr.Consumer(h.arena, h.layout, readable_fd=h.readable_fd, writable_fd=h.writable_fd)
    os.close(h.readable_fd)
    os.close(h.writable_fd)
    rng = random.Random(h.params["seed"] ^ 0x5A5A)
    buf = bytearray(h.params["max_chunk"])
    view = memoryview(buf)
    crc = 0
    total = 0
    timeouts = 0
    while True:
        n = c.read_into(view[: rng.randint(1, len(buf))])
        if n:
            crc = zlib.crc32(view[:n], crc)
            total += n
            continue
        if c.state != sr.RingState.OPEN and c.readable() == 0:
            break
        if not c.wait_readable(10.0):
            timeouts += 1
            break
    return {"crc": crc, "total": total, "timeouts": timeouts, "state": int(c.state)}


def _pingpong(h_in: Handover, h_out: Handover) -> dict[str, Any]:
    """Echo each byte from ring `in` to ring `out`; sleep on the eventfd when empty.

    The first half waits with the blocking `wait_readable`, the second half with the
    external-poller protocol (arm_readable, poll the fd, ack_wake) that asyncio uses.
    """
    c = sr.Consumer(h_in.arena, h_in.layout, readable_fd=h_in.readable_fd, writable_fd=h_in.writable_fd)
    p = sr.Producer(h_out.arena, h_out.layout, readable_fd=h_out.readable_fd, writable_fd=h_out.writable_fd)
    for fd in (h_in.readable_fd, h_in.writable_fd, h_out.readable_fd, h_out.writable_fd):
        os.close(fd)
    count = h_in.params["count"]
    poller = select.poll()
    poller.register(c.fileno(), select.POLLIN)
    buf = bytearray(1)
    slept = timeouts = 0
    for i in range(count):
        while c.read_into(buf) == 0:
            if c.state != sr.RingState.OPEN:
                return {"done": i, "slept": slept, "timeouts": timeouts, "error": "closed early"}
            if i < count // 2:
                slept += 1
                if not c.wait_readable(5.0):
                    timeouts += 1
                    return {"done": i, "slept": slept, "timeouts": timeouts}
            elif not c.arm_readable():
                slept += 1
                if not poller.poll(5000):
                    timeouts += 1
                    return {"done": i, "slept": slept, "timeouts": timeouts}
                c.ack_wake()
        if buf[0] != i & 0xFF:
            return {"done": i, "slept": slept, "timeouts": timeouts, "error": f"byte {buf[0]} != {i & 0xFF}"}
        while p.write(buf) == 0:  # capacity >= 1 and the parent drains: only transiently full
            if not p.wait_writable(5.0):
                timeouts += 1
                return {"done": i, "slept": slept, "timeouts": timeouts}
    return {"done": count, "slept": slept, "timeouts": timeouts}


def _consume_bytes(h: Handover) -> dict[str, Any]:
    """Read single bytes as fast as they come from a tiny ring; verify the sequence."""
    c = sr.Consumer(h.arena, h.layout, readable_fd=h.readable_fd, writable_fd=h.writable_fd)
    os.close(h.readable_fd)
    os.close(h.writable_fd)
    count = h.params["count"]
    buf = bytearray(1)
    got = slept = timeouts = 0
    while got < count:
        if c.read_into(buf):
            if buf[0] != got & 0xFF:
                return {"done": got, "error": f"byte {buf[0]} != {got & 0xFF}"}
            got += 1
            continue
        slept += 1
        if not c.wait_readable(5.0):
            timeouts += 1
            break
    return {"done": got, "slept": slept, "timeouts": timeouts}


def child_main(role: str, sock_fd: int) -> None:
    sock = socket.socket(fileno=sock_fd)
    _, rings = recv_ring(sock)
    t0 = time.perf_counter()
    if role == "stream-consumer":
        result = _consume_stream(rings[0])
    elif role == "pingpong":
        result = _pingpong(rings[0], rings[1])
    elif role == "bytes-consumer":
        result = _consume_bytes(rings[0])
    else:
        raise SystemExit(f"unknown role {role!r}")
    result["seconds"] = time.perf_counter() - t0
    sock.sendall(json.dumps(result).encode())
    sock.close()


def spawn(role: str) -> tuple[Any, socket.socket]:
    """Start a child running `role`; returns (Popen, parent socket)."""
    import subprocess

    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ringproc.py"), role, str(child.fileno())],
        pass_fds=[child.fileno()],
    )
    child.close()
    return proc, parent


def collect(proc: Any, sock: socket.socket, timeout: float) -> dict[str, Any]:
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    finally:
        sock.close()
        proc.wait(timeout=timeout)
    assert proc.returncode == 0, f"child exited with {proc.returncode}"
    return json.loads(b"".join(chunks))


if __name__ == "__main__":
    child_main(sys.argv[1], int(sys.argv[2]))
