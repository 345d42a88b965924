"""The orchestrator: run authority (spec §9-13, §16, §36-40). See docs/orchestrator.md.

  main, config   the process (`swactor-orchestrator`: wiring, serving, SIGTERM) and its [orchestrator] table
  api/           the gRPC API: the thin servicer, request validation and errors, TCP access (TLS + token)
  runs/          a run's life and the runs around it: domain API, run FSM + runner, queue, store, retention
  planning/      where a run goes and when it may start: RunPlan, placement, the PoolReady gate, dry run
  fleet/         the member nodes: membership view, node events, the stage fleet, restart reconciliation
  tokens/        the token path: tokenizer, prompt ids, the token-in / token-out rings and edges
  models/        served models: registry, GGUF facts, sources, distribution to stage hosts, ListModels
"""
