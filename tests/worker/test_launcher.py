"""The native launcher (worker/compute/launcher.c) on kernels of our own: every slice of a sliced launch runs exactly
once per run, and a serial launch sees all slices of the launch before it finished, with more pool threads than cores
(the case where a thread is descheduled mid-run)."""
from __future__ import annotations

import ctypes
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from swactor.worker.compute.replay import MAX_ARGS, Launch, launcher

KERNELS = r"""
#include <stdint.h>
/* a few microseconds of work before the count, so that a slice another thread runs is still running when the caller
   has taken the rest */
void bump(uint64_t *count, int slice) {
  for (volatile int i = 0; i < 3000; i++) {}
  count[slice] += 1;
}
/* serial: one more round; every slice counter must have reached it */
void check(uint64_t *count, uint64_t *state, int slices) {
  state[0] += 1;
  for (int i = 0; i < slices; i++) if (count[i] != state[0]) state[1] += 1;
}
"""

pytestmark = pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang (tinygrad's CPU device needs it too)")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
  d = tmp_path_factory.mktemp("kernels")
  (d / "k.c").write_text(KERNELS)
  subprocess.run(["clang", "-O1", "-shared", "-fPIC", "-o", str(d / "k.so"), str(d / "k.c")], check=True)
  return ctypes.CDLL(str(pathlib.Path(d / "k.so")))


def launch(fn: ctypes._CFuncPtr, args: list[int], core_slot: int = -1, slices: int = 0) -> Launch:
  return Launch(ctypes.cast(fn, ctypes.c_void_p).value, core_slot, slices, (ctypes.c_uint64 * MAX_ARGS)(*args))


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_every_slice_once_and_serial_after_all(kernels: ctypes.CDLL, threads: int) -> None:
  lib = launcher()
  assert lib is not None
  slices, runs = 12, 1000
  count, state = np.zeros(slices, np.uint64), np.zeros(2, np.uint64)
  c, s = count.ctypes.data, state.ctypes.data
  bump = launch(kernels.bump, [c, 0], core_slot=1, slices=slices)
  check = launch(kernels.check, [c, s, slices])
  table = (Launch * 4)(bump, check, bump, check)  # back to back: the second bump reuses the counters the check read
  pool = lib.swl_pool_new(threads, 50_000)
  assert pool
  try:
    for _ in range(runs):
      lib.swl_run(pool, ctypes.addressof(table), len(table))
  finally:
    lib.swl_pool_free(pool)
  assert state[1] == 0, f"{state[1]} checks saw a slice of the launch before them unfinished"
  assert state[0] == 2 * runs and (count == 2 * runs).all(), count


def test_pools_start_and_stop_repeatedly() -> None:
  lib = launcher()
  assert lib is not None
  for threads in (1, 2, 4) * 10:
    pool = lib.swl_pool_new(threads, 0)  # spin 0: the threads go to sleep at once, stop must wake them
    assert pool
    lib.swl_pool_free(pool)
  assert lib.swl_pool_new(0, 0) is None
