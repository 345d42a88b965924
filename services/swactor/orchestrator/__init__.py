"""The orchestrator: run authority (spec §9-13, §16, §36-40). See docs/orchestrator.md.

  main, config, service  the process, its [orchestrator] table, the thin gRPC servicer
  api_access     the optional TCP API: TLS and a bearer token     validation  SubmitRun checks needing no model
  manager        the domain API the servicer delegates to (submit, stop, inspect runs)
  prompting      a SubmitRun's prompt ids (chat template, tokenizing off the loop)
  dry_run        Plan: what SubmitRun would do on the pool as it is now
  queue          the run queue (QUEUED runs behind the active one)   retention  which finished runs to delete
  models         model name -> GGUF, loaded on first use   gguf_model  model facts from the GGUF
  tokenizer/     GGUF BPE tokenizer + chat templates
  nodes, membership_client, pool   the membership view and the PoolReady gate (§9)
  planner        RunPlan (§11)       placement  which nodes and layer ranges, and whether they fit
  fsm            the run FSM core, I/O-free                        runner  its asyncio adapter
  run_messages   the run FSM's request, config, inputs and actions
  store          SQLite run store + lifecycle events          errors  request errors -> gRPC status
  fleet          the Protocols toward the node services (StageFleet, TokenEndpoints)
  stage_fleet    StageFleet over the node control API (stage.proto, mutual TLS)
  token_endpoints, token_rings   TokenEndpoints over real edges (swactor.edgeend) and their ring halves
  node_events    §40 node lifecycle events from the membership view
  reconcile, reconcile_shell   restart reconciliation: tear down what a previous process left (core, shell)
  sources        where a model's GGUF comes from (local path or URL)   model_listing  ListModels
  distributor    model distribution: manifests, the model server, each stage's GgufSource
"""
