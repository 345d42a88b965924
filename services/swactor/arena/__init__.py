"""swactor-arena: one sparse memfd arena per host and the ring leases inside it (spec §18-19, §38).

  fsm       the arena's lifecycle FSM           model    plain data: requests, leases, holders, events
  freelist  sorted, coalesced free ranges       table    the lease table: the I/O-free core
  ports     what the table needs from outside   errors   the core's one error type
  ringids   ring ids never reused on this host  memory   the memfd, header init through ring-rs, hole punching
  handout   SCM_RIGHTS fd hand-out, holder liveness       peercred  who is on the other end (SO_PEERCRED)
  node      the table wired to memory, hand-out and log   journal   core events -> structured log events
  convert   protobuf <-> core data              service  the gRPC servicer       config, main  the process
  client    what other services import to use the arena (the asyncio client, the holder hand-out)

The ring layout value the arena mints is `swactor.common.layout.Layout`.
"""
