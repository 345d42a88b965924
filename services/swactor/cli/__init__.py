"""`swactor`: the operator CLI, a client of the orchestrator's gRPC API.

  main    the `swactor` command and its subcommands over the orchestrator's API
  render  human-readable lines for runs, nodes and lifecycle events (--json prints protobuf JSON)
  demo    `swactor demo`: a local pool (swactor.localcluster) and a run on it
"""
