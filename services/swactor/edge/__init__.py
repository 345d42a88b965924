"""swactor-edge: the host's QUIC edge driver (spec §23-25, §35), on aioquic. See docs/edge.md.

One concern per module. The I/O-free core (time passed in, tested linked in memory):
  table       the edge table: edges, receive demux, rendezvous glue, routing of stream events
  sendpump    §25 send pump      recvpump   §25 recv pump      pumpstate  their FSMs (one
              transition function, `edge.pump_state` events)
  streamport  what the cores need from a QUIC connection; application error codes
  rendezvous  §25 spec/stream rendezvous      preamble   uni-stream edge_id preamble
  credit      receive-credit policy           objtap     per-object timing tap
  timingflush ObjectTimings batches from the taps
  owners      which local process owns each edge; an owner whose last WatchEdges stream ended is gone
The shell (sockets, timers, the event loop):
  driver      asyncio shell: requests, ring wakes, QUIC events into the table, its outputs out
  watchers    WatchEdges fan-out              status     GetStatus, systemd STATUS=
  endpoint    the one UDP socket, CID demux, connection cache, dialing
  admission   which datagrams may start a connection (pure)      ratelimit  token bucket, time passed in
  guard       admission's timers: refusal summaries, flood mode
  retry_token QUIC Retry tokens (stateless address validation)   sockfilter BPF filter dropping Initial floods
  connection  one QUIC connection: timers, keepalive, events; the StreamPort over aioquic
  quic_conn   aioquic connection: ring-driven credit, bounded send queue, pinned mutual TLS,
              multi-frame packets (the one module on aioquic's private API)
  mtu         default datagram size from the route
  config      EdgeConfig ([edge] table)       identity   node key + certificate, fingerprint
  ring_source the rings pumped here: arena attach, ring ends (swactor.common.ringport), wake fds
  wakefd      wake-eventfd hand-out socket    peers      PeerDirectory (membership, file)
  service     gRPC servicer                   main       CLI
"""
