"""Direct replay of captured TinyJit kernels on tinygrad's CPU device, one native call per step (swactor_ring's launcher).

Why: TinyJit's replay resolves every kernel's buffers, launch dims and ctypes arguments again on each call (~25 us of
Python per kernel), and tinygrad runs a kernel's core_id slices one after another on one core. A decode step of the
30-layer model is ~750 kernels. A CPU program is a plain C function `f(buffer addresses..., variables...)` and the
buffers of a captured graph never move, so a Plan resolves them once into a `swactor_ring.LaunchTable`; a run hands it
and the bound variables (start_pos, ...) to a `swactor_ring.LaunchPool`, which calls the kernels and splits each sliced
kernel over a pool of native threads (ring-rs/src/launch, built with the extension at install time). Anything that is
not a plain CPU program (copies, graphs, other devices, more than LAUNCH_MAX_ARGS parameters), or an extension built
without the launcher (an architecture other than x86-64/AArch64), makes plan() return False: callers keep TinyJit's
own replay then.
"""
from __future__ import annotations

import functools
import platform
from dataclasses import dataclass, field

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.device import Buffer
from tinygrad.dtype import _to_np_dtype
from tinygrad.engine.jit import CapturedJit
from tinygrad.engine.realize import get_runtime, resolve_params
from tinygrad.runtime.ops_cpu import CPUProgram
from tinygrad.uop.ops import Ops, UOp, sym_infer

import swactor_ring
from swactor.common.events import get_logger

SPIN_NS = 200_000      # how long an idle pool thread spins before it sleeps: covers the serial kernels between two matvecs


@functools.cache
def available() -> bool:
  """Whether the extension has the launcher (x86-64 and AArch64 builds); says so once when not."""
  if hasattr(swactor_ring, "LaunchPool"):
    return True
  # still correct without it (TinyJit's replay), only slower
  get_logger().warning("compute_launcher_unavailable", machine=platform.machine())
  return False


@functools.cache
def pool(threads: int) -> swactor_ring.LaunchPool:
  """The native thread pool (caller + threads-1 workers) shared by every plan of this process that runs on `threads`
  cores. Runs queue: one table at a time (one step at a time in the compute process)."""
  return swactor_ring.LaunchPool(threads, SPIN_NS)


@dataclass
class Plan:
  out: Tensor                     # the captured graph's output tensor (its buffer is fixed too)
  threads: int = 1
  table: swactor_ring.LaunchTable | None = field(default_factory=lambda: swactor_ring.LaunchTable() if available() else None)
  sym_slices: list[tuple[int, UOp]] = field(default_factory=list)  # (launch, slice count that depends on variables)
  keep: list[object] = field(default_factory=list)  # what the table's addresses point into: buffers, kernels' code

  def __call__(self, var_vals: dict[str, int]) -> None:
    assert self.table is not None, "plan() refused this plan"
    for i, n in self.sym_slices:
      self.table.set_slices(i, sym_infer(n, var_vals))
    pool(self.threads).run(self.table, var_vals)


def plan(captured: CapturedJit, inputs: list[UOp], into: Plan) -> bool:
  """Append the captured kernels, bound to `inputs` (as passed to captured()), to `into`; False if it can't."""
  if into.table is None:
    return False
  for call in captured.linear.src:
    ast = call.src[0]
    if ast.op is not Ops.PROGRAM or not isinstance(dev := call.src[1].device, str):
      return False
    rt = get_runtime(dev, ast)
    resolved = resolve_params(call, tuple(inputs))
    bufs = [resolved[i].buffer for i in ast.arg.globals]
    nargs = len(bufs) + len(ast.arg.vars)
    if not isinstance(rt, CPUProgram) or rt.lvp or nargs > swactor_ring.LAUNCH_MAX_ARGS or not all(isinstance(b, Buffer) for b in bufs):
      return False
    bufs = [b.ensure_allocated() for b in bufs]
    core = rt.runtimevars.get("core_id")
    n = ast.arg.global_size[0]
    i = into.table.push(rt.addr, [b.get_buf(dev).va_addr for b in bufs] + [0] * len(ast.arg.vars), core,
                        n if isinstance(n, int) else 0)
    if core is not None and not isinstance(n, int):
      into.sym_slices.append((i, n))
    for j, v in enumerate(ast.arg.vars):
      if v.expr != "core_id":
        into.table.bind(v.expr, i, len(bufs) + j, int(v.vmin), int(v.vmax))
    into.keep.extend([*bufs, rt])
  return True


def read(t: Tensor) -> np.ndarray:
  """A host copy of a realized tensor's buffer: the device's own copy-out (Buffer.numpy() schedules a copy through
  tinygrad's realize, ~0.8 ms per call, more than a 30-layer decode step's Python otherwise costs)."""
  buf = t.uop.base.buffer
  out = np.empty(buf.size, _to_np_dtype(buf.dtype))
  Device[buf.device].synchronize()
  buf.allocator._copyout(memoryview(out.view(np.uint8)), buf._buf)
  return out.reshape(t.shape)
