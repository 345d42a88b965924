"""gpu-worker service: stage control on the node plus the supervised compute process. See docs/worker.md.

Spec §8 (NodeAvailable), §12 (ProvisionStage), §14 (StageController), §26-27 (edge records and
Tx/Rx lifecycles), §28-33 (worker process boundary, ring FSMs, device bridge), §38 (teardown).

  main, config, service  the service: entry point, [worker] table, StageControl gRPC servicer
  node         StageNode: StageController + EdgeEstablisher + GpuWorkerCtl wired to the local services
  plan         ProvisionStage validation -> StagePlan
  stage_fsm    StageController core (§14)          edge_actors  Tx/Rx lifecycles (§27)
  stage_messages  the StageController's plan, inputs and actions
  stage_lease  the orchestrator's hold on a run, kept alive by its control stream
  weights      the stage's weight fetch (shell over swactor.distribution)   tracebatch  per-object trace events
  stage_memory the device memory this node offers a stage (NodeAvailable)
  ctl_fsm, ctl GpuWorkerCtl (§28, §31): core + asyncio subprocess shell of the compute process
  ctl_port     the node's view of its ctl (WorkerCtlLike) and the ring host it makes of it
  membership   MembershipPort (§8 NodeAvailable) and its SetLocalState client
  process/     the compute process (`python -m swactor.worker.process`)
  compute/     the tinygrad model core the compute process runs (docs/compute.md)

The edge-end machinery the node shares with the orchestrator (establisher, ring-object FSMs, ring
ports) is `swactor.edgeend`; control TLS and the cluster secret are in `swactor.common`.
"""
