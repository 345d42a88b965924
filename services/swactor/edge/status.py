"""What the driver reports about itself: GetStatus, and systemd's STATUS= line (coalesced)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from swactor.common.systemd import notify_status
from swactor.edge.endpoint import Endpoint
from swactor.edge.table import EdgeTable
from swactor.edge.traffic import traffic_protos
from swactor.v1 import edge_pb2

STATUS_INTERVAL = 1.0


def driver_status(node_id: int, fingerprint: str, endpoint: Endpoint, table: EdgeTable,
                  transfers: Iterable[edge_pb2.ObjectTransfers] = ()) -> edge_pb2.EdgeDriverStatus:
    st = edge_pb2.EdgeDriverStatus(
        node_id=node_id,
        endpoint=f"{endpoint.address[0]}:{endpoint.address[1]}" if endpoint.address else "",
        cert_fingerprint=fingerprint,
        pending_streams=table.parked_streams,
    )
    for conn in endpoint.connections:
        if conn.closed:
            continue
        st.connections.append(edge_pb2.ConnectionStatus(
            peer_node_id=conn.peer_node_id or 0,
            peer_address=f"{conn.peer_addr[0]}:{conn.peer_addr[1]}" if conn.peer_addr else "",
            initiated_here=conn.initiated_here,
            streams=table.streams_on(conn.uid),
            max_datagram_size=conn.max_datagram_size,
        ))
    adm = endpoint.admission
    st.admission.refused.update({r.key: n for r, n in adm.totals.items() if n})
    st.admission.retries_sent = adm.retries_sent
    st.admission.handshakes_admitted = adm.admitted
    st.admission.half_open = adm.half_open_total
    st.admission.streams_wrong_producer = table.streams_wrong_producer
    st.traffic.extend(traffic_protos(endpoint.traffic_totals()))
    st.transfers.extend(transfers)
    for rec in table.edges.values():
        st.edges.append(edge_pb2.EdgeStatus(
            edge_id=rec.edge_id, ring_id=rec.ring_id, role=rec.role,  # type: ignore[arg-type]
            state=rec.state, peer_node_id=rec.peer_node_id, bytes=rec.pump.bytes,
        ))
    return st


def status_line(endpoint: Endpoint, table: EdgeTable) -> str:
    conns = sum(1 for c in endpoint.connections if not c.closed and c.handshake.done())
    faulted = sum(1 for r in table.edges.values() if r.state == "Faulted")
    return f"{conns} connections, {len(table.edges)} edges ({faulted} faulted), {table.parked_streams} parked streams"


class StatusNotifier:
    """sd_notify STATUS=: at most one update per STATUS_INTERVAL, only when the line changed."""

    def __init__(self, line: Callable[[], str]) -> None:
        self._line = line
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._sent = ""

    def changed(self) -> None:
        if self._timer is None:
            self._timer = self._loop.call_later(STATUS_INTERVAL, self._send)

    def _send(self) -> None:
        self._timer = None
        line = self._line()
        if line != self._sent:
            self._sent = line
            notify_status(line)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
