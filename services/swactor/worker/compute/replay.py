"""Direct replay of captured TinyJit kernels on tinygrad's CPU device.

Why: TinyJit's replay resolves every kernel's buffers, launch dims and ctypes arguments again on each call (~25 us of
Python per kernel); a decode step of the 30-layer model is ~600 kernels, so that was ~15 ms of an ~85 ms token. A CPU
program is a plain C function `f(buffer addresses..., variables...)`, and the buffers of a captured graph never move, so
a Plan resolves them once and a run only fills in the bound variables (start_pos, ...) and calls the functions.
Anything that is not a plain CPU program (copies, graphs, other devices) makes plan() return None: callers keep
TinyJit's own replay then.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
from tinygrad import Tensor
from tinygrad.device import Buffer
from tinygrad.engine.jit import CapturedJit
from tinygrad.engine.realize import get_runtime, resolve_params
from tinygrad.runtime.ops_cpu import CPUProgram
from tinygrad.uop.ops import Ops, UOp, sym_infer


@dataclass
class Launch:
  fxn: Callable[..., None]
  args: list[int]                 # buffer addresses, then one slot per variable
  binds: list[tuple[int, str]]    # (slot, variable name) filled per run
  core: int | None                # slot of core_id: tinygrad splits the kernel into `threads` independent slices
  threads: int | UOp

  def slices(self, lo: int, hi: int) -> None:
    a = list(self.args)
    for t in range(lo, hi):
      a[self.core] = t  # type: ignore[index]
      self.fxn(*a)


@dataclass
class Plan:
  out: Tensor                     # the captured graph's output tensor (its buffer is fixed too)
  pool: ThreadPoolExecutor | None = None  # runs a kernel's core_id slices on several cores: ctypes drops the GIL in the call
  launches: list[Launch] = field(default_factory=list)
  keep: list[Buffer] = field(default_factory=list)  # the buffers whose addresses are baked into the launches

  def __call__(self, var_vals: dict[str, int]) -> None:
    w = 1 if self.pool is None else self.pool._max_workers + 1
    for k in self.launches:
      for i, name in k.binds:
        k.args[i] = var_vals[name]
      if k.core is None:
        k.fxn(*k.args)
        continue
      n = k.threads if isinstance(k.threads, int) else sym_infer(k.threads, var_vals)
      cuts = [n * j // min(w, n) for j in range(min(w, n) + 1)]  # contiguous runs of slices, the first one on this thread
      futs = [self.pool.submit(k.slices, a, b) for a, b in pairwise(cuts[1:])] if self.pool else []
      k.slices(cuts[0], cuts[1])
      for f in futs:
        f.result()


def plan(captured: CapturedJit, inputs: list[UOp], into: Plan) -> bool:
  """Append the captured kernels, bound to `inputs` (as passed to captured()), to `into`; False if it can't."""
  for call in captured.linear.src:
    ast = call.src[0]
    if ast.op is not Ops.PROGRAM or not isinstance(dev := call.src[1].device, str):
      return False
    rt = get_runtime(dev, ast)
    resolved = resolve_params(call, tuple(inputs))
    bufs = [resolved[i].buffer for i in ast.arg.globals]
    if not isinstance(rt, CPUProgram) or rt.lvp or not all(isinstance(b, Buffer) for b in bufs):
      return False
    bufs = [b.ensure_allocated() for b in bufs]
    args = [b.get_buf(dev).va_addr for b in bufs] + [0] * len(ast.arg.vars)
    binds = [(len(bufs) + i, v.expr) for i, v in enumerate(ast.arg.vars) if v.expr != "core_id"]
    fxn = ctypes.CFUNCTYPE(None, *[ctypes.c_uint64] * len(args))(rt.addr)  # ints go straight in, no per-call c_uint64()
    into.launches.append(Launch(fxn, args, binds, rt.runtimevars.get("core_id"), ast.arg.global_size[0]))
    into.keep.extend(bufs)
  return True


def read(t: Tensor) -> np.ndarray:
  """A host copy of a realized tensor's buffer (no schedule, unlike Tensor.numpy())."""
  return t.uop.base.buffer.numpy().reshape(t.shape)


@functools.cache
def pool(threads: int) -> ThreadPoolExecutor | None:
  """The worker threads shared by every plan that runs kernels on `threads` cores (the caller's thread is one of them)."""
  return ThreadPoolExecutor(threads - 1, thread_name_prefix="swactor-compute") if threads > 1 else None
