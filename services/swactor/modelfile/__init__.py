"""GGUF model files, shared by the orchestrator, the stage hosts and the compute core (imports none
of them): what the workers can run and which tensors a stage reads (`support`, the one
declaration), the one header parser, from a byte prefix (`header`), the one hyper-parameter reader
and `ModelRefused` (`params`), judging a model from its header (`judge`), and the per-piece manifest
stage hosts verify fetched ranges against (`manifest`). docs/distribution.md.
"""
