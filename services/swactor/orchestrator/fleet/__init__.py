"""The fleet: the member nodes as the orchestrator sees them, and the stages it runs on them.

  nodes              NodeInfo: one member as the orchestrator sees it
  membership_client  follows the local membership service (WatchMembers) into the view
  node_events        §40 node lifecycle events (node_started, node_available, node_faulted) from the view
  fleet              the StageFleet / TokenEndpoints Protocols toward the node services, FleetError
  stage_fleet        StageControlFleet: the StageFleet over stage.proto (ProvisionStage / WatchStage / StopRun, mTLS)
  reconcile          restart reconciliation: tear down what a previous process left in flight (I/O-free core)
  reconcile_shell    its asyncio shell: StopRun / WatchStage to nodes, StopEdge to the local edge-driver
  pool_metrics       GetPoolMetrics: every member's GetHostMetrics (monitoring), asked at once, silent ones named
"""
