"""swactor-edge: the host's QUIC edge driver (spec §23-25, §35), on aioquic. See docs/edge.md.

One concern per module:
  config      EdgeConfig ([edge] table)            identity   node key + certificate, fingerprint
  quic_conn   aioquic connection: ring-driven credit, bounded send queue, pinned mutual TLS,
              multi-frame packets                   mtu        default datagram size from the route
  connection  one QUIC connection: timers, keepalive, events
  endpoint    the one UDP socket, CID demux, connection cache, dialing
  preamble    uni-stream edge_id preamble           credit     receive-credit policy (pure)
  rendezvous  §25 spec/stream rendezvous (pure)     pumps      recv/send pumps
  ring_source the rings pumped here: arena attach, ring ends (swactor.common.ringport), wake fds
  wakefd      wake-eventfd hand-out socket          peers      PeerDirectory (membership, file)
  driver      edges, routing, events                service    gRPC servicer       main  CLI
"""
