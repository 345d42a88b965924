"""gpu-worker service: stage control on the node plus the supervised compute process.

Spec §8 (NodeAvailable), §12 (ProvisionStage), §14 (StageController), §26-27 (edge records and
Tx/Rx lifecycles), §28-33 (worker process boundary, ring FSMs, device bridge), §38 (teardown).
"""
