"""The compute process of a gpu-worker node (spec §28-33), spawned by GpuWorkerCtl as
`python -m swactor.worker.process` (`__main__.py`).

- `loop.py`: the process itself: worker FSM (§31), command table, ring progress loop, `main()`;
- `wire.py`: the JSON process adapter (§28-30) spoken with GpuWorkerCtl on stdin/stdout;
- `fdpass.py`: the SCM_RIGHTS side channel carrying ring eventfds from GpuWorkerCtl (both halves);
- `device.py`: §33 device bridge over tinygrad buffers (the ring-object FSMs' sink and source);
- `roles.py`, `llama_role.py`: ConfigureRole, the llama stage role over `swactor.worker.compute`;
- `role_loader.py`: a cold ConfigureRole load on its own thread.

The ring-object FSMs and the ring adapter it drives are shared with the orchestrator and live in
`swactor.edgeend`. Importing this package imports nothing: GpuWorkerCtl imports `wire` and
`fdpass` from here without loading the process's dependencies.
"""
