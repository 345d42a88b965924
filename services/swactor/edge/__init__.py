"""swactor-edge: the host's QUIC edge driver (spec §23-25, §35), on aioquic.

Modules, one concern each: `config` (EdgeConfig), `identity` (node key and certificate),
`quic_conn` (aioquic connection with ring-driven credit and pinned TLS), `endpoint` (the one UDP
socket, connection cache, keepalive), `preamble` (uni-stream edge_id preamble), `credit` (flow
control policy), `rendezvous` (§25 demux core), `ring_port` (adapter to ring-rs), `pumps`
(recv/send pumps), `driver` (edges, events), `peers` (PeerDirectory), `service` (gRPC), `main`.
"""
