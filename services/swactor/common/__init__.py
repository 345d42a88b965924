"""What every swactor service shares.

  config       host config file ([section] tables), default dirs    ids      node / run / edge ids
  events       structured JSON events (structlog)                   grpcio   gRPC server/channel glue
  systemd      sd_notify                                            reasons  §37 reason names
  secret       the cluster secret and the gossip key derived from it
  control_tls  mutual TLS for the node control API, rooted in the cluster secret
  ringport     ring ends over ring-rs (swactor_ring): the one adapter of every ring user
  ringerrors   what a ring end raises: RingBroken (a §37 RingFaultReason), RingClosed
"""
