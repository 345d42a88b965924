"""`swactor`: the operator CLI, a client of the orchestrator's gRPC API."""
