"""swactor-arena: one sparse memfd arena per host and the ring leases inside it (spec §18-19, §38).

Files: `fsm` (lifecycle), `freelist` and `table` (the I/O-free lease core), `memory` (memfd, header
init through ring-rs, hole punching), `handout` (SCM_RIGHTS fd hand-out and holder liveness),
`service` (gRPC), `main` (entry point), `client` (what other services import).
"""
