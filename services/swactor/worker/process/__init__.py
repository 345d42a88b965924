"""The compute process of a gpu-worker node (spec §28-33), spawned by GpuWorkerCtl as
`python -m swactor.worker.process` (`__main__.py`).

A pure core and a thin I/O shell:
- `core.py`: `WorkerCore.handle(input) -> actions`: the worker FSM state, the command table, the
  step in flight, the device-handle table; `waits()` names the ring ends worth sleeping on;
- `fsm.py`: the worker FSM (§31): states, transition table, which commands each state serves;
- `rings.py`: the installed rings, each with its §32 ring-object FSM (`swactor.edgeend.objects`);
- `roleslot.py`: the resident role and its loads (ConfigureRole, CancelRole, warm reuse);
- `messages.py`: the core's other inputs (wakes, loader events, action outcomes) and its actions;
- `failures.py`: which §37 reason an exception out of role code becomes, by type;
- `shell.py`: performs the actions (arena, fd side channel, ring ends, device, role code, load threads);
- `loop.py`: `main()` and the loop sleeping on stdin, the loaders' wakeup pipe and armed ring eventfds;
- `wire.py`: the JSON process adapter (§28-30) spoken with GpuWorkerCtl on stdin/stdout;
- `fdpass.py`: the SCM_RIGHTS side channel carrying ring eventfds from GpuWorkerCtl (both halves);
- `device.py`: §33 device bridge over tinygrad buffers (a `DeviceAllocation` is the FSMs' sink and source);
- `roles.py`, `llama_role.py`: role code, the llama stage role over `swactor.worker.compute`;
- `role_loader.py`: cold loads on their own threads, reporting through a queue and a wakeup pipe;
- `testhooks.py`: test-only fault hooks (tests/faults/), each off unless its variable is set.

Importing this package imports nothing: GpuWorkerCtl imports `wire` and `fdpass` from here without
loading the process's dependencies.
"""
