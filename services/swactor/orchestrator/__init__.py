"""The orchestrator: run authority (spec §9-13, §16, §36-40). See docs/orchestrator.md.

  main, config, service  the process, its [orchestrator] table, the thin gRPC servicer
  manager        the domain API the servicer delegates to (submit, stop, inspect runs)
  models         model name -> GGUF, loaded on first use   gguf_model  model facts from the GGUF
  tokenizer/     GGUF BPE tokenizer + chat templates
  nodes, membership_client, pool   the membership view and the PoolReady gate (§9)
  planner        RunPlan (§11)       fsm  the run FSM core, I/O-free     runner  its asyncio adapter
  run_messages   the run FSM's request, config, inputs and actions
  store          SQLite run store + lifecycle events          errors  request errors -> gRPC status
  fleet          the Protocols toward the node services (StageFleet, TokenEndpoints)
  stage_fleet    StageFleet over the node control API (stage.proto, mutual TLS)
  token_endpoints, token_rings   TokenEndpoints over real edges (swactor.edgeend) and their ring halves
"""
