"""A second process for the arena tests: `python holder_child.py MODE FD_SOCKET SOCKET [ARGS]`.

Modes:
  pingpong RING_IN RING_OUT   attach both rings, read "ping" on RING_IN, answer on RING_OUT, detach
  lease CAPACITY              lease + attach a ring, print its id, then obey stdin lines:
                              "close" (close the hand-out connection), "fork" (fork a child that
                              keeps connection and mapping, print its pid), never exit by itself
  connect                     connect only; print the handout or the refusal
  connect-as UID              the same after dropping to uid/gid UID (needs root)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import swactor_ring
from swactor.arena.client import ArenaHandoutError, Leased, connect_holder

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: make `tests` importable
from swactor.v1 import arena_pb2, common_pb2
from tests.arena.sync_client import ArenaClient


def say(*parts: object) -> None:
    print(*parts, flush=True)


def pingpong(client: ArenaClient, ring_in: int, ring_out: int) -> None:
    arena = client.hold.map()
    lin = client.attach(ring_in, arena_pb2.ATTACH_ROLE_WORKER_RING)
    lout = client.attach(ring_out, arena_pb2.ATTACH_ROLE_WORKER_RING)
    consumer = swactor_ring.Consumer(arena, swactor_ring.RingLayout(*_fields(lin)))
    producer = swactor_ring.Producer(arena, swactor_ring.RingLayout(*_fields(lout)))
    buf = bytearray(64)
    deadline = time.monotonic() + 10
    got = b""
    while not got.endswith(b"\n") and time.monotonic() < deadline:
        n = consumer.read_into(buf)
        got += bytes(buf[:n])
        if not n:
            time.sleep(0.001)
    producer.write(b"pong from %d after %s" % (os.getpid(), got))
    del consumer, producer
    client.detach(ring_in, arena_pb2.DETACH_PROOF_RING_QUIESCED)
    client.detach(ring_out, arena_pb2.DETACH_PROOF_RING_QUIESCED)
    say("done")


def _fields(layout: common_pb2.RingLayout) -> tuple[int, ...]:
    return (
        layout.ring_id,
        layout.arena_offset,
        layout.total_len,
        layout.header_offset,
        layout.data_offset,
        layout.data_capacity,
        layout.alignment,
    )


def hold_a_lease(client: ArenaClient, capacity: int) -> None:
    out = client.lease(
        request_id=os.getpid(),
        requester="holder-child",
        edge_id=77,
        direction=common_pb2.RING_DIRECTION_EGRESS,
        ring_spec=common_pb2.RingSpec(data_capacity=capacity, alignment=64),
    )
    assert isinstance(out, Leased), out
    client.attach(out.ring_id, arena_pb2.ATTACH_ROLE_PUMP)
    arena = client.hold.map()
    swactor_ring.Producer(arena, out.ring_layout()).write(b"x" * 4096)  # really touch it
    say("ring", out.ring_id, client.hold.holder_id)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "close":
            client.close()
            client.hold.close()  # connection and fd closed; the process keeps its mapping
            say("closed")
        elif cmd == "fork":
            pid = os.fork()
            if pid == 0:  # keeps the inherited connection and mapping until killed
                os.close(0)
                while True:
                    time.sleep(3600)
            say("forked", pid)
    while True:  # stdin closed: stay alive until killed
        time.sleep(3600)


def main() -> None:
    mode, fd_socket, socket_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if mode == "connect-as":  # drop to another uid first: SO_PEERCRED is taken at connect()
        uid = int(sys.argv[4])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        mode = "connect"
    try:
        hold = connect_holder(fd_socket)
    except ArenaHandoutError as e:
        say("denied", e)
        return
    if mode == "connect":
        say("handout", hold.holder_id, hold.arena_len)
        return
    client = ArenaClient(hold, socket_path)
    if mode == "pingpong":
        pingpong(client, int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "lease":
        hold_a_lease(client, int(sys.argv[4]))


if __name__ == "__main__":
    main()
