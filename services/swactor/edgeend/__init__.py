"""The edge end: what a host needs to own one end of an edge (spec §17-18, §22, §26, §32, §38),
shared by the gpu-worker's stage node and the orchestrator's token endpoints.

An edge end is a ring leased from the local arena-manager, installed in a *ring host* (the compute
process on a stage node, the orchestrator process for token-in / token-out), and handed to the local
edge-driver, whose pump moves its bytes over QUIC. Objects cross the ring as §17 headers + payloads.
Every ring end, here and in the edge-driver's pumps, is a `swactor.common.ringport` end; a ring's
layout is a `swactor.common.layout.Layout`.

  establisher        EdgeEstablisher record FSM (§26) with the §38 teardown order: the I/O-free core
  establisher_shell  its asyncio shell: runs the core's actions against the ports and a RingHost
  ports              ArenaPort / DriverPort: what the shell needs from the arena-manager and edge-driver
  adapters           those ports over the real services (arena client, edge.proto, wake-fd socket)
  objects            §32 ring-object FSMs (IngressParser, EgressProducer, ObjectRules) and the §17
                     ObjectSpec they check, I/O-free
  header             the §17 ObjectHeader codec over ring-rs (the FSMs' HeaderCodec)
  hostobjects        the FSMs' sink and source in host memory (token endpoints)
  timings            the edge-driver's per-object timings relayed as run lifecycle events
"""
