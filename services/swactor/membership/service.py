"""The Membership gRPC servicer: thin, every answer comes from MembershipNode."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from swactor.common.clock import wall_us
from swactor.membership.metadata import MetadataError, decode_tags
from swactor.membership.node import MembershipNode
from swactor.membership.swim import Liveness
from swactor.membership.view import MemberRecord, ViewEvent, ViewEventKind
from swactor.v1 import membership_pb2 as pb
from swactor.v1 import membership_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Membership"].full_name

# The view's enums and the proto's share their value names: the tables are derived, so they cannot drift.
_STATUS = {s: pb.MemberStatus.Value(f"MEMBER_STATUS_{s.name}") for s in Liveness}
_KIND = {k: pb.MemberEventKind.Value(f"MEMBER_EVENT_KIND_{k.name}") for k in ViewEventKind}


def member_message(record: MemberRecord, local_metadata: pb.NodeMetadata | None = None) -> pb.Member:
    m = record.member
    md = local_metadata if record.is_self and local_metadata is not None else decode_tags(dict(m.meta))
    return pb.Member(
        metadata=md,
        gossip_address=m.addr,
        status=_STATUS[m.liveness],
        incarnation=m.incarnation,
        epoch=m.epoch,
        status_since_us=record.status_since_us,
        is_self=record.is_self,
    )


class MembershipServicer(pb_grpc.MembershipServicer):
    def __init__(self, node: MembershipNode, cluster: str) -> None:
        self._node = node
        self._cluster = cluster

    def _counters(self) -> pb.MembershipCounters:
        c = self._node.view.counts()
        s = self._node.swim_counters()
        return pb.MembershipCounters(
            alive=c.alive, suspect=c.suspect, dead=c.dead, left=c.left,
            rejected_packets=s.decrypt_failures + s.decode_errors,
            decrypt_failures=s.decrypt_failures, decode_errors=s.decode_errors,
            packets_received=s.packets_received, probes_sent=s.probes_sent, probes_failed=s.probes_failed,
            suspicions=s.suspicions, refutations=s.refutations, local_health=s.local_health,
        )

    def _member(self, record: MemberRecord) -> pb.Member:
        return member_message(record, self._node.metadata)

    def _event(self, ev: ViewEvent, snapshot: bool = False) -> pb.MemberEvent:
        return pb.MemberEvent(
            kind=_KIND[ev.kind], member=self._member(ev.record), incarnation=ev.record.member.incarnation,
            time_us=ev.time_us, snapshot=snapshot,
        )

    async def GetSelf(self, request: pb.GetSelfRequest, context: grpc.aio.ServicerContext) -> pb.GetSelfResponse:
        return pb.GetSelfResponse(
            self=self._member(self._node.view.local()), counters=self._counters(), cluster=self._cluster
        )

    async def ListMembers(
        self, request: pb.ListMembersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMembersResponse:
        records = self._node.view.records(include_departed=request.include_departed)
        members = sorted((self._member(r) for r in records), key=lambda m: (not m.is_self, m.metadata.node_id))
        return pb.ListMembersResponse(members=members, counters=self._counters())

    async def WatchMembers(
        self, request: pb.WatchMembersRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.MemberEvent]:
        sub = self._node.subscribe()  # before the snapshot, so no change falls between the two
        try:
            if request.include_snapshot:
                t = wall_us()
                for r in self._node.view.records(include_departed=False):
                    yield self._event(ViewEvent(ViewEventKind.JOIN, r, t), snapshot=True)
            while True:
                ev = await sub.queue.get()
                if ev is None:
                    if sub.overflowed:
                        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "watcher fell behind; watch again")
                    return
                yield self._event(ev)
        finally:
            self._node.unsubscribe(sub)

    async def SetLocalState(
        self, request: pb.SetLocalStateRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetLocalStateResponse:
        try:
            record = await self._node.set_local_state(request)
        except (ValueError, MetadataError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.SetLocalStateResponse(self=self._member(record))

    async def GetRtts(self, request: pb.GetRttsRequest, context: grpc.aio.ServicerContext) -> pb.GetRttsResponse:
        return pb.GetRttsResponse(rtts=[
            pb.MemberRtt(from_node_id=r.from_node, to_node_id=r.to_node, rtt_us=r.rtt_us, age_ms=int(r.age_s * 1000))
            for r in self._node.rtts()])
