"""`python -m swactor.worker.process`: the compute process GpuWorkerCtl spawns (see loop.py)."""

from swactor.worker.process.loop import main

main()
