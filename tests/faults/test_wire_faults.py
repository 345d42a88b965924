"""Edge and wire faults on the edge from stage 0 (h0) to stage 1 (h1), each checked end to end
(tests/faults/checks.py):

* crafted on the wire by a rogue peer that holds h0's real edge identity (its certificate and key from
  h0's state dir) and dials h1 from inside h0's network namespace (tests/faults/rogue_peer.py): a
  malformed object header, an extent over max_extent, a sequence violation, EOF mid-object, a stream
  reset mid-object, a stream for an edge id nobody established;
* an edge whose peer never opens its end: h1's edge endpoint never answers h0's dial;
* a ring fault: the interior stage's ingress ring header corrupted in the arena's shared memory.

How the rogue gets onto an edge: the receiving driver takes a stream for an edge only from the plan's
producer node (table.py, spec §4/§39), which a member proves with its pinned certificate. The rogue is
that node as far as TLS can tell (h0's key), on its own QUIC connection from h0's address. It opens the
edge's stream as soon as the run's plan names the edge id (GetRun's placement), so its stream is the
edge's stream; the real producer opens its own only at its first committed bytes, after the readiness
barrier (sendpump.py), by when the run has faulted. Nothing in the services is changed for this: no
test hook, the real admission, pinning and producer check.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from swactor.edge.streamport import AppError
from swactor.localcluster.cluster import DEFAULT_MODEL
from swactor.localcluster.layout import EDGE_PORT
from swactor.orchestrator.models.gguf_model import read_model
from swactor.orchestrator.planning.planner import activation_spec
from swactor.v1 import common_pb2 as pb
from swactor.v1 import edge_pb2, edge_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults import inject
from tests.faults.checks import C, FaultCheck, expect, with_detail
from tests.faults.pool import FaultPool, NotYet, RunWatch, wait_until

PRODUCER, CONSUMER = 0, 1  # the edge under attack: stage 0 on h0 -> stage 1 on h1
RING_STATE_OFFSET = 192  # ring-rs abi.rs: the state word in the ring header


# ---- the rogue peer (a child process in h0's namespace) ----


class RoguePeer:
    """tests/faults/rogue_peer.py run as h0 inside h0's network namespace, dialling h1's edge endpoint."""

    def __init__(self, pool: FaultPool, as_host: int, to_host: int) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", pool.netns(as_host), sys.executable, "-m", "tests.faults.rogue_peer",
             "--state-dir", str(pool.hosts[as_host].state_dir), "--peer", pool.cluster.public_endpoint(to_host, EDGE_PORT)],
            cwd=inject.REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        threading.Thread(target=self._read, daemon=True, name="rogue-stdout").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self.lines.append("exited")
            self._cond.notify_all()

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        """The first line starting with `prefix` (fails if the rogue exits first)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if "exited" in self.lines:
                    raise AssertionError(f"rogue peer exited: {self.lines} {self._stderr()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rogue peer: no {prefix!r} within {timeout_s:.0f} s: {self.lines}")
                self._cond.wait(left)

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-2000:]

    def command(self, line: str, answer: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.wait_line(f"{answer} ", 10)

    def open(self, edge_id: int, craft: str, *args: int) -> int:
        """A uni-stream for `edge_id` carrying the craft; its stream id."""
        return int(self.command(" ".join(["open", str(edge_id), craft, *map(str, args)]), "opened").split()[1])

    def reset(self, stream_id: int, code: int) -> None:
        self.command(f"reset {stream_id} {code}", "reset")

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@contextlib.contextmanager
def rogue_peer(pool: FaultPool, as_host: int = PRODUCER, to_host: int = CONSUMER) -> Iterator[RoguePeer]:
    rogue = RoguePeer(pool, as_host, to_host)
    try:
        rogue.wait_line("ready", 15)  # its TLS handshake with the peer is done
        yield rogue
    finally:
        rogue.close()


# ---- what the tests read off the pool ----


def activation_rules() -> tuple[int, int]:
    """(row bytes, the largest max_extent) of the run's activation edges: the orchestrator plans them
    for its max_seq_len cap, never beyond the model's own context."""
    facts, _ = read_model(DEFAULT_MODEL)
    spec = activation_spec(facts, facts.max_seq_len)
    return spec.row_elements * spec.dtype_width_bytes, spec.max_extent


def stage_inbound_edge(pool: FaultPool, run: RunWatch, stage: int, timeout_s: float = 10.0) -> int:
    """The edge id the run's plan gives stage `stage`'s input (GetRun's placement, set once planned)."""
    def probe() -> int:
        placement = pool.get_run(run.run_id).placement
        if len(placement) <= stage or not placement[stage].inbound_edge_id:
            raise NotYet(f"run {run.run_id} not planned yet ({run.describe()})")
        return int(placement[stage].inbound_edge_id)

    return wait_until(f"run {run.run_id} planned", probe, timeout_s, poll_s=0.01)


def edge_status(pool: FaultPool, host: int) -> edge_pb2.EdgeDriverStatus:
    with grpc.insecure_channel(f"unix:{pool.hosts[host].sock('edge')}") as ch:
        return edge_pb2_grpc.EdgeDriverStub(ch).GetStatus(edge_pb2.GetStatusRequest(), timeout=5)


def recv_streaming(pool: FaultPool, host: int, edge_id: int) -> None:
    for e in edge_status(pool, host).edges:
        if e.edge_id == edge_id and e.role == edge_pb2.EDGE_ROLE_RECV and e.bytes > 0:
            return
    raise NotYet(f"h{host}: no recv pump with bytes for edge {edge_id}")


def rogue_stream_read(pool: FaultPool, run: RunWatch, edge_id: int) -> None:
    """The consumer's recv pump has bytes on the edge, or the run already has its outcome."""
    if not run.outcome_events():
        recv_streaming(pool, CONSUMER, edge_id)


# ---- crafted by the rogue peer ----

OBJECT_FAILED = [  # (fault, craft, its arguments from (row, max_extent), the §37 ObjectFailure, run reason)
    ("malformed object header (rogue h0 -> h1)", "bad_magic", lambda row, mx: (), "OBJECT_FAILURE_HEADER_MALFORMED",
     pb.RUN_FAULT_OBJECT_FAILED),
    ("extent over max_extent (rogue h0 -> h1)", "over_max", lambda row, mx: (mx,), "OBJECT_FAILURE_EXTENT_EXCEEDS_MAX",
     pb.RUN_FAULT_OBJECT_FAILED),
    ("sequence violation (rogue h0 -> h1)", "sequence", lambda row, mx: (row, 7), "OBJECT_FAILURE_SEQUENCE_VIOLATION",
     pb.RUN_FAULT_SEQUENCE_VIOLATION),
    ("EOF mid-object (rogue h0 -> h1)", "eof_mid", lambda row, mx: (row,), "OBJECT_FAILURE_EOF_MID_OBJECT",
     pb.RUN_FAULT_OBJECT_FAILED),
]


@pytest.mark.parametrize("fault,craft,args,failure,reason", OBJECT_FAILED,
                         ids=["malformed_header", "extent_over_max", "sequence_violation", "eof_mid_object"])
def test_rogue_object(pool: FaultPool, request: pytest.FixtureRequest, fault: str, craft: str, args, failure: str,
                      reason: int) -> None:  # type: ignore[no-untyped-def]
    """The receiving worker's ingress parser (§17, §32) refuses the record before any device object:
    the stage faults with the §37 ObjectFailure named in the detail."""
    check = FaultCheck(pool, fault, expect((reason, C.COMPONENT_WORKER), detail_has=failure), test=request.node.nodeid)
    with rogue_peer(pool) as rogue:
        # h0's own edge driver is not heard on h1 until h1 reads the rogue's stream for the edge: on a busy box the
        # real producer's stream could otherwise claim the edge first and the run would never see the crafted object
        with inject.hold_udp_from(pool, PRODUCER, sport=EDGE_PORT, to_host=CONSUMER):
            run = pool.submit(max_tokens=4)
            edge = stage_inbound_edge(pool, run, CONSUMER)
            t = time.time()
            rogue.open(edge, craft, *args(*activation_rules()))
            wait_until(f"h{CONSUMER} reads the rogue's stream", lambda: rogue_stream_read(pool, run, edge), 10, poll_s=0.01)
        with_detail(check, check.outcome(run, t))
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


def test_rogue_stream_reset(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """RESET_STREAM mid-object, once h1's recv pump runs the rogue's stream: the receiving edge driver
    faults the edge STREAM_FAULT_STREAM_RESET (any code that is not one of the drivers' own)."""
    check = FaultCheck(pool, "stream reset mid-object (rogue h0 -> h1)",
                       expect((pb.RUN_FAULT_STREAM_FAULT, C.COMPONENT_EDGE_DRIVER), detail_has="STREAM_FAULT_STREAM_RESET"),
                       test=request.node.nodeid)
    row, _ = activation_rules()
    with rogue_peer(pool) as rogue:
        run = pool.submit(max_tokens=4)
        edge = stage_inbound_edge(pool, run, CONSUMER)
        sid = rogue.open(edge, "partial", row)
        wait_until(f"h{CONSUMER} pumps the rogue's stream", lambda: recv_streaming(pool, CONSUMER, edge), 10, poll_s=0.01)
        t = time.time()
        rogue.reset(sid, 0x5EED)
        with_detail(check, check.outcome(run, t))
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


def test_rogue_unknown_edge(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """A stream for an edge id no plan has, opened mid-decode: h1's driver parks it (it could be an
    edge not established yet, §25) and refuses it after the rendezvous timeout; the run it came
    beside is not disturbed and completes."""
    check = FaultCheck(pool, "unknown edge id (rogue h0 -> h1, mid-decode)", expect(outcome=opb.RUN_OUTCOME_COMPLETED),
                       test=request.node.nodeid)
    with rogue_peer(pool) as rogue:
        run = pool.submit(max_tokens=12)
        run.wait_tokens(2)
        t = time.time()
        sid = rogue.open(0x0BAD_ED6E_0000_0001, "object", activation_rules()[0])
        check.outcome(run, t)
        stopped = rogue.wait_line(f"stop_sending {sid} ", 15)
        refused_s = time.time() - t
    assert int(stopped.split()[2]) == AppError.RENDEZVOUS_TIMEOUT, f"unknown edge: {stopped}"
    check.row.detected_by = "EDGE_DRIVER"
    check.row.reason += f"; rogue stream refused STREAM_FAULT_RENDEZVOUS_TIMEOUT after {refused_s:.1f} s"
    assert edge_status(pool, CONSUMER).pending_streams == 0, "the refused stream is still parked"
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


# ---- the peer never opens its end ----


def no_connection(pool: FaultPool, host: int, peer: int) -> None:
    peer_id = pool.node_id(peer)
    if any(c.peer_node_id == peer_id for c in edge_status(pool, host).connections):
        raise NotYet(f"h{host} still has a connection to h{peer}")


def test_edge_peer_never_opens(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """h1's edge endpoint never answers h0's dial (h0's packets to it dropped in h0's namespace; every
    service runs): stage 0's send edge cannot come up within the driver's connect_timeout (5 s)."""
    check = FaultCheck(pool, "edge establishment failure (h1's edge endpoint never answers h0)",
                       expect((pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, C.COMPONENT_EDGE_DRIVER),
                              detail_has="STREAM_FAULT_PEER_UNREACHABLE"), test=request.node.nodeid)
    with inject.block_udp_to(pool, PRODUCER, dport=pool.cluster.public_port(EDGE_PORT), to_host=CONSUMER):
        # the cached connection dies first (idle timeout, 3 s): the run's edge has to dial
        wait_until("h0's connection to h1 gone", lambda: no_connection(pool, PRODUCER, CONSUMER), 20, poll_s=0.1)
        t = time.time()
        run = pool.submit(max_tokens=4)
        with_detail(check, check.outcome(run, t))
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


# ---- a ring broken under a running stage ----


@contextlib.contextmanager
def arena_mapped(pool: FaultPool, host: int) -> Iterator[mmap.mmap]:
    """The host's arena memfd, mapped here (the hand-out any holder gets)."""
    from swactor.arena.client import connect_holder

    with connect_holder(pool.hosts[host].sock("arena-fd")) as hold, mmap.mmap(hold.fd, hold.arena_len) as mem:
        yield mem


def test_ring_fault_mid_decode(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """The interior stage's ingress ring header gets a state word no ring-rs state has, mid-decode
    (a stray write into shared memory): whichever side touches the ring next, the recv pump (edge
    driver) or the worker's parser, finds RingStateInvalid and stage 1 faults RING_FAULT. Its recv pump
    also stops the stream (code RING_FAULT), so stage 0's send pump faults at the same moment
    (STREAM_RESET, naming that code) and either report may reach the orchestrator first."""
    check = FaultCheck(pool, "ring fault: interior ingress ring state corrupted mid-decode",
                       expect((pb.RUN_FAULT_RING_FAULT, C.COMPONENT_WORKER),
                              (pb.RUN_FAULT_RING_FAULT, C.COMPONENT_EDGE_DRIVER),
                              (pb.RUN_FAULT_STREAM_FAULT, C.COMPONENT_EDGE_DRIVER)), test=request.node.nodeid)
    run = pool.submit(max_tokens=2000)
    run.wait_tokens(3)
    edge = stage_inbound_edge(pool, run, CONSUMER)
    leases = [x for x in pool.cluster.arena_stats(CONSUMER).leases if x.edge_id == edge]
    assert len(leases) == 1, f"h{CONSUMER}: {len(leases)} leased ring(s) for edge {edge}"
    lease = leases[0]
    with arena_mapped(pool, CONSUMER) as mem:
        at = lease.layout.header_offset + RING_STATE_OFFSET  # absolute in the arena (ring-rs layout.rs)
        t = time.time()
        mem[at:at + 4] = struct.pack("<I", 0xBAD0BAD0)
    first = check.outcome(run, t)
    with_detail(check, first)
    if first.reason == "RUN_FAULT_STREAM_FAULT":  # stage 0's echo: it must name the peer's ring-fault code
        assert f"code {AppError.RING_FAULT:#x}" in first.detail, f"ring fault: first fault {first.detail!r}"
    ring = [e for e in run.events if e.kind == pb.STAGE_FAULTED and e.stage_index == CONSUMER]
    assert ring and ring[0].reason == "RUN_FAULT_RING_FAULT", (
        f"ring fault: stage {CONSUMER} did not fault RING_FAULT: {[(e.reason, e.detail) for e in ring]}")
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()
