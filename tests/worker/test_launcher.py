"""The native launcher (swactor_ring's LaunchPool, ring-rs/src/launch) on kernels of our own: every slice of a sliced
launch runs exactly once per run, and a serial launch sees all slices of the launch before it finished, with more pool
threads than cores (the case where a thread is descheduled mid-run); variables reach their slots within their bounds;
bad tables are refused with a message."""
from __future__ import annotations

import ctypes
import pathlib
import shutil
import subprocess
import threading

import numpy as np
import pytest

import swactor_ring
from swactor.worker.compute import replay

KERNELS = r"""
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>
static pthread_t caller;  /* the thread that runs serial launches: check() records it */
/* The caller gives its core away for a moment in each slice it runs, so that pool threads get slices even on a busy
   host; a pool thread's slice takes longer, so that it is still running when the caller has taken the rest. */
void bump(uint64_t *count, int slice) {
  usleep(pthread_equal(pthread_self(), caller) ? 20 : 200);
  count[slice] += 1;
}
/* serial: one more round; every slice counter must have reached it */
void check(uint64_t *count, uint64_t *state, int slices) {
  caller = pthread_self();
  state[0] += 1;
  for (int i = 0; i < slices; i++) if (count[i] != state[0]) state[1] += 1;
}
/* serial: where a variable lands */
void record(int64_t *out, int a, int b) { out[0] = a; out[1] = b; }
"""

# The test kernels are C compiled here, like tinygrad's CPU kernels (its CPU device needs clang too); the launcher
# itself is part of the swactor_ring extension.
pytestmark = [pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang (tinygrad's CPU device needs it too)"),
              pytest.mark.skipif(not replay.available(), reason="the extension has no launcher on this architecture")]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
  d = tmp_path_factory.mktemp("kernels")
  (d / "k.c").write_text(KERNELS)
  subprocess.run(["clang", "-O1", "-shared", "-fPIC", "-o", str(d / "k.so"), str(d / "k.c")], check=True)
  return ctypes.CDLL(str(pathlib.Path(d / "k.so")))


def addr(fn: ctypes._CFuncPtr) -> int:
  return ctypes.cast(fn, ctypes.c_void_p).value


def bump_check_table(kernels: ctypes.CDLL, count: np.ndarray, state: np.ndarray, pairs: int = 8) -> swactor_ring.LaunchTable:
  """`pairs` times (bump, check) back to back: each bump reuses the counters the check before it read. Several pairs
  per run: pool threads sleep when a run ends, so in the first pair the caller may run every slice alone."""
  c, s = count.ctypes.data, state.ctypes.data
  t = swactor_ring.LaunchTable()
  for _ in range(pairs):
    t.push(addr(kernels.bump), [c, 0], core_slot=1, slices=len(count))
    t.push(addr(kernels.check), [c, s, len(count)])
  return t


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_every_slice_once_and_serial_after_all(kernels: ctypes.CDLL, threads: int) -> None:
  slices, runs = 12, 60
  count, state = np.zeros(slices, np.uint64), np.zeros(2, np.uint64)
  table = bump_check_table(kernels, count, state)
  pool = swactor_ring.LaunchPool(threads, 1_000_000)
  for _ in range(runs):
    pool.run(table, {})
  del pool
  assert state[1] == 0, f"{state[1]} checks saw a slice of the launch before them unfinished"
  assert state[0] == 8 * runs and (count == 8 * runs).all(), count


def test_runs_from_two_python_threads_queue(kernels: ctypes.CDLL) -> None:
  """run() releases the GIL; a second caller on the same pool waits for the first run instead of joining it."""
  pool, runs = swactor_ring.LaunchPool(3, 1_000_000), 30
  tables = [(np.zeros(8, np.uint64), np.zeros(2, np.uint64)) for _ in range(2)]

  def go(count: np.ndarray, state: np.ndarray) -> None:
    table = bump_check_table(kernels, count, state)
    for _ in range(runs):
      pool.run(table, {})

  ts = [threading.Thread(target=go, args=cs) for cs in tables]
  for t in ts:
    t.start()
  for t in ts:
    t.join()
  for count, state in tables:
    assert state[1] == 0 and state[0] == 8 * runs and (count == 8 * runs).all(), (count, state)


def test_variables_reach_their_slots_within_bounds(kernels: ctypes.CDLL) -> None:
  out = np.zeros(2, np.int64)
  t = swactor_ring.LaunchTable()
  i = t.push(addr(kernels.record), [out.ctypes.data, 0, 0])
  t.bind("start_pos", i, 1, 0, 511)
  t.bind("row", i, 2, -3, 3)
  pool = swactor_ring.LaunchPool(2)
  pool.run(t, {"start_pos": 511, "row": -3, "unused": 7})
  assert out.tolist() == [511, -3]
  with pytest.raises(ValueError, match=r"start_pos = 512 is outside 0..=511"):
    pool.run(t, {"start_pos": 512, "row": 0})
  with pytest.raises(ValueError, match="no value for variable row"):
    pool.run(t, {"start_pos": 1})


def test_bad_tables_are_refused(kernels: ctypes.CDLL) -> None:
  t = swactor_ring.LaunchTable()
  with pytest.raises(ValueError, match="address is 0"):
    t.push(0, [])
  with pytest.raises(ValueError, match=f"at most {swactor_ring.LAUNCH_MAX_ARGS}"):
    t.push(addr(kernels.bump), [0] * (swactor_ring.LAUNCH_MAX_ARGS + 1))
  with pytest.raises(ValueError, match="core slot 2"):
    t.push(addr(kernels.bump), [0, 0], core_slot=2, slices=4)
  i = t.push(addr(kernels.bump), [0, 0], core_slot=1, slices=4)
  with pytest.raises(ValueError, match="not a variable slot"):
    t.bind("v", i, 1, 0, 3)
  with pytest.raises(ValueError, match="not sliced"):
    t.set_slices(t.push(addr(kernels.check), [0, 0, 0]), 2)
  with pytest.raises(ValueError, match="threads must be >= 1"):
    swactor_ring.LaunchPool(0)
  assert len(t) == 2


def test_pools_start_and_stop_repeatedly() -> None:
  for threads in (1, 2, 4) * 10:
    pool = swactor_ring.LaunchPool(threads, 0)  # spin 0: the threads go to sleep at once, stop must wake them
    assert pool.threads == threads
    del pool
