"""Runs: one run's life (the run FSM and its asyncio runner), the runs around it and their records.

  manager          Orchestrator: the domain API the servicer delegates to (submit, stop, inspect runs)
  fsm              the run FSM (§13): an I/O-free core, `RunFsm.handle(input, now) -> actions`
  run_messages     what the run FSM takes and gives: the run's request and config, its inputs and actions
  runner           the asyncio adapter around one RunFsm (timers, fleet calls, store, watchers)
  queue            the run queue: RunQueue (pure FIFO core), QueuedRun, RunLobby (its shell)
  store            the SQLite run store: runs and every lifecycle event, restart recovery
  retention        which finished runs the store deletes, and when (pure)
  client_requests  client request ids: a SubmitRun sent again gets the run the first one created
  run_sampling     a run's sampling as applied and as recorded (a sampled run without a seed gets one)
"""
