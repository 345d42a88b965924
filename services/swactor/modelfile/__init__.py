"""GGUF model files as distribution sees them, shared by the orchestrator and the stage hosts
(imports neither): what the workers can run and which tensors a stage reads (`support`), the
header parsed from a byte prefix (`header`), judging a model from its header (`judge`), the
per-piece manifest stage hosts verify fetched ranges against (`manifest`), and a stage's device memory
estimated from the header (`memory`: the planner's, and the compute core's `device_nbytes`).
docs/distribution.md, docs/orchestrator.md (placement).
"""
