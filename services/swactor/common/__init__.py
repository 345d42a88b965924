"""What every swactor service shares.

  config       the host config file ([section] tables), default dirs
  sockets      each local service's Unix socket (the default of every [section] naming one); EdgeEndSockets
  ids          node / run / edge ids                events    structured JSON events (structlog)
  grpcio       gRPC listeners, health and reflection; LocalClient, a local service's channel
  systemd      sd_notify                            aio       cancel_and_wait (shutting tasks down)
  reasons      §37 reasons are the common.proto enums; ReasonError, the one (reason, detail) error
  secret       the cluster secret and the gossip key derived from it
  control_tls  mutual TLS for the node control API, rooted in the cluster secret
  layout       the §18 ring layout value (and its proto spelling)
  ringport     ring ends over ring-rs (swactor_ring): the one adapter of every ring user
  ringerrors   what a ring end raises: RingBroken (a §37 RingFaultReason), RingClosed
  sampling     a run's SamplingPolicy (§10)
  fsmtable     a state machine's transitions as a table; InvalidTransition (arena §19, compute process §31)
  msgbase      the facts several FSM cores' messages carry (OfRing, OfEdge, OfRole, Failure) as bases
  objflags     ObjectHeader.flags bits (§17)       files     durable state files (whole or not at all)
(GGUF model files — the header parser, hyper-parameters, what the workers support — are swactor.modelfile.)
"""
