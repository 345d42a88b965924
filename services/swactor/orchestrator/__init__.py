"""The orchestrator: run authority (spec §9-13, §16, §36-40).

Files: `gguf_model` (model facts from the GGUF), `tokenizer/` (GGUF BPE tokenizer + chat
templates), `planner` (RunPlan), `pool` (PoolReady gate), `fsm` (run FSM core, I/O-free),
`store` (SQLite run store), `fleet` (the Protocol toward node services), `runner` (asyncio
adapter around the FSM), `service` (gRPC servicer), `main` (the process).
"""
