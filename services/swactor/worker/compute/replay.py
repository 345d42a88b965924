"""Direct replay of captured TinyJit kernels on tinygrad's CPU device, one native call per step (launcher.c).

Why: TinyJit's replay resolves every kernel's buffers, launch dims and ctypes arguments again on each call (~25 us of
Python per kernel), and tinygrad runs a kernel's core_id slices one after another on one core. A decode step of the
30-layer model is ~750 kernels. A CPU program is a plain C function `f(buffer addresses..., variables...)` and the
buffers of a captured graph never move, so a Plan resolves them once into a table of launches; a run patches the bound
variables (start_pos, ...) into that table and hands it to launcher.c, which calls the kernels and splits each sliced
kernel over a pool of native threads. Anything that is not a plain CPU program (copies, graphs, other devices, more
than MAX_ARGS parameters), or no C compiler to build the launcher, makes plan() return False: callers keep TinyJit's
own replay then.
"""
from __future__ import annotations

import ctypes
import functools
import os
import pathlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.device import Buffer
from tinygrad.dtype import _to_np_dtype
from tinygrad.engine.jit import CapturedJit
from tinygrad.engine.realize import get_runtime, resolve_params
from tinygrad.runtime.ops_cpu import CPUProgram
from tinygrad.uop.ops import Ops, UOp, sym_infer

from swactor.common.events import get_logger

MAX_ARGS = 16          # launcher.c's MAX_ARGS
SPIN_NS = 200_000      # how long an idle pool thread spins before it sleeps: covers the serial kernels between two matvecs


class Launch(ctypes.Structure):
  _fields_ = [("fn", ctypes.c_void_p), ("core_slot", ctypes.c_int32), ("slices", ctypes.c_int32), ("args", ctypes.c_uint64 * MAX_ARGS)]


WORDS = ctypes.sizeof(Launch) // 8  # a launch as uint64 words: fn, (core_slot, slices), args...


@functools.cache
def launcher() -> ctypes.CDLL | None:
  """launcher.c built with the C compiler tinygrad's CPU device uses ($CC, else clang); None where there is none."""
  if (cc := shutil.which(os.environ.get("CC", "clang"))) is None:
    return None
  src = pathlib.Path(__file__).with_name("launcher.c")
  with tempfile.TemporaryDirectory(prefix="swactor-launcher-") as d:
    so = pathlib.Path(d) / "launcher.so"
    try:
      subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(so), str(src)], check=True, capture_output=True, text=True)
      lib = ctypes.CDLL(str(so))  # stays mapped after the file is removed
    except (OSError, subprocess.CalledProcessError) as e:
      # still correct without it (TinyJit's replay), only slower: say so once
      get_logger().warning("compute_launcher_unavailable", compiler=cc, error=str(getattr(e, "stderr", None) or e)[-500:])
      return None
  lib.swl_pool_new.restype, lib.swl_pool_new.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_int64]
  lib.swl_run.restype, lib.swl_run.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
  lib.swl_pool_free.restype, lib.swl_pool_free.argtypes = None, [ctypes.c_void_p]
  return lib


@functools.cache
def pool(threads: int) -> int:
  """The native thread pool (caller + threads-1 workers) shared by every plan of this process that runs on `threads`
  cores. Plans run one at a time (one step at a time in the compute process); the pool is not reentrant."""
  lib = launcher()
  assert lib is not None
  if not (p := lib.swl_pool_new(threads, SPIN_NS)):
    raise RuntimeError(f"could not start {threads - 1} compute threads")
  return p


@dataclass
class Plan:
  out: Tensor                     # the captured graph's output tensor (its buffer is fixed too)
  threads: int = 1
  launches: list[Launch] = field(default_factory=list)
  binds: dict[str, list[int]] = field(default_factory=dict)        # variable -> word indices in the table
  sym_slices: list[tuple[int, UOp]] = field(default_factory=list)  # (launch, slice count that depends on variables)
  keep: list[Buffer] = field(default_factory=list)  # the buffers whose addresses are baked into the launches
  _table: ctypes.Array[Launch] | None = None
  _words: np.ndarray | None = None

  def __call__(self, var_vals: dict[str, int]) -> None:
    if self._table is None:
      self._table = (Launch * len(self.launches))(*self.launches)
      self._words = np.frombuffer(self._table, np.uint64)
    assert self._words is not None
    for name, idx in self.binds.items():
      self._words[idx] = var_vals[name]
    for i, n in self.sym_slices:
      self._table[i].slices = sym_infer(n, var_vals)
    lib = launcher()
    assert lib is not None
    lib.swl_run(pool(self.threads), ctypes.addressof(self._table), len(self.launches))


def plan(captured: CapturedJit, inputs: list[UOp], into: Plan) -> bool:
  """Append the captured kernels, bound to `inputs` (as passed to captured()), to `into`; False if it can't."""
  if launcher() is None:
    return False
  for call in captured.linear.src:
    ast = call.src[0]
    if ast.op is not Ops.PROGRAM or not isinstance(dev := call.src[1].device, str):
      return False
    rt = get_runtime(dev, ast)
    resolved = resolve_params(call, tuple(inputs))
    bufs = [resolved[i].buffer for i in ast.arg.globals]
    nargs = len(bufs) + len(ast.arg.vars)
    if not isinstance(rt, CPUProgram) or rt.lvp or nargs > MAX_ARGS or not all(isinstance(b, Buffer) for b in bufs):
      return False
    bufs = [b.ensure_allocated() for b in bufs]
    i = len(into.launches)
    core = rt.runtimevars.get("core_id")
    n = ast.arg.global_size[0]
    into.launches.append(Launch(rt.addr, -1 if core is None else core, n if isinstance(n, int) else 0,
                                (ctypes.c_uint64 * MAX_ARGS)(*[b.get_buf(dev).va_addr for b in bufs])))
    if core is not None and not isinstance(n, int):
      into.sym_slices.append((i, n))
    for j, v in enumerate(ast.arg.vars):
      if v.expr != "core_id":
        into.binds.setdefault(v.expr, []).append(i * WORDS + 2 + len(bufs) + j)
    into.keep.extend(bufs)
  return True


def read(t: Tensor) -> np.ndarray:
  """A host copy of a realized tensor's buffer: the device's own copy-out (Buffer.numpy() schedules a copy through
  tinygrad's realize, ~0.8 ms per call, more than a 30-layer decode step's Python otherwise costs)."""
  buf = t.uop.base.buffer
  out = np.empty(buf.size, _to_np_dtype(buf.dtype))
  Device[buf.device].synchronize()
  buf.allocator._copyout(memoryview(out.view(np.uint8)), buf._buf)
  return out.reshape(t.shape)
