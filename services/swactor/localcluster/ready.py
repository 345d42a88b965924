"""Readiness evidence, polled (never slept on blindly): gRPC health SERVING on a service's socket,
the membership view, the orchestrator's ListNodes."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import membership_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb

T = TypeVar("T")
POLL_S = 0.1


class NotReady(Exception):
    """The condition does not hold yet; the message says what is missing."""


def health_serving(socket: Path) -> None:
    if not socket.is_socket():
        raise NotReady(f"socket {socket} does not exist yet")
    with grpc.insecure_channel(f"unix:{socket}") as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
        except grpc.RpcError as e:
            raise NotReady(f"health check on {socket}: {e.code().name}") from None  # type: ignore[attr-defined]
    if resp.status != health_pb2.HealthCheckResponse.SERVING:
        raise NotReady(f"{socket} is {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}")


def http_serving(url: str) -> None:
    """Any HTTP answer from `url` (a 503 from a gateway whose pool is not ready is still a server up)."""
    try:
        with urllib.request.urlopen(url, timeout=2.0):
            return
    except urllib.error.HTTPError:
        return
    except OSError as e:
        raise NotReady(f"{url}: {e}") from None


def members(socket: Path) -> list[mpb.Member]:
    with grpc.insecure_channel(f"unix:{socket}") as ch:
        try:
            return list(membership_pb2_grpc.MembershipStub(ch).ListMembers(mpb.ListMembersRequest(), timeout=2.0).members)
        except grpc.RpcError as e:
            raise NotReady(f"ListMembers on {socket}: {e.code().name}") from None  # type: ignore[attr-defined]


def all_available(socket: Path, node_ids: set[int]) -> list[mpb.Member]:
    view = members(socket)
    ok = {m.metadata.node_id for m in view
          if m.status == mpb.MEMBER_STATUS_ALIVE and m.metadata.state == mpb.NODE_STATE_AVAILABLE}
    missing = node_ids - ok
    if missing:
        states = {m.metadata.node_id: (mpb.MemberStatus.Name(m.status), mpb.NodeState.Name(m.metadata.state))
                  for m in view}
        raise NotReady("membership: not all Available: "
                       + ", ".join(f"{n}={states.get(n, 'unknown')}" for n in sorted(missing)))
    return view


def pool_ready(stub, node_ids: set[int]) -> opb.ListNodesResponse:
    try:
        resp = stub.ListNodes(opb.ListNodesRequest(), timeout=2.0)
    except grpc.RpcError as e:
        raise NotReady(f"orchestrator ListNodes: {e.code().name}") from None  # type: ignore[attr-defined]
    prov = {n.node_id for n in resp.nodes if n.provisionable}
    if not node_ids <= prov:
        raise NotReady(f"orchestrator: provisionable {sorted(prov)} of {sorted(node_ids)}; {resp.pool_detail}")
    if not resp.pool_ready:
        raise NotReady(resp.pool_detail)
    return resp


def wait_for(what: str, probe: Callable[[], T], timeout_s: float, *, check: Callable[[], None] = lambda: None,
             progress: Callable[[str], None] | None = None) -> T:
    """Poll `probe` until it returns; `check` raises when a watched process died (fails fast).
    On timeout: TimeoutError naming `what` and the last reason it was not ready."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        check()
        try:
            return probe()
        except NotReady as e:
            # Report a new reason, not every tick of a counter in the same one.
            if progress is not None and re.sub(r"[0-9.]+", "#", str(e)) != re.sub(r"[0-9.]+", "#", last):
                progress(f"{what}: {e}")
            last = str(e)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s: {last}")
        time.sleep(POLL_S)
