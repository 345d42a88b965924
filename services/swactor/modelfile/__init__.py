"""GGUF model files, shared by the orchestrator, the stage hosts and the compute core (imports none
of them): what the workers can run and which tensors a stage reads (`support`, the one
declaration), the one header parser, from a byte prefix (`header`), the one hyper-parameter reader
and `ModelRefused` (`params`), judging a model from its header (`judge`), the per-piece manifest
stage hosts verify fetched ranges against (`manifest`), and a stage's device memory estimated from
the header (`memory`: the planner's, and the compute core's `device_nbytes`).
docs/distribution.md, docs/orchestrator.md (placement).
"""
