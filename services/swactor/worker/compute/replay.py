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
from tinygrad.device import Buffer, TinyELF
from tinygrad.dtype import DType, _to_np_dtype
from tinygrad.engine.jit import CapturedJit
from tinygrad.engine.realize import get_call_arg_uops, get_runtime, resolve_params
from tinygrad.runtime.ops_cpu import CPUProgram
from tinygrad.uop.ops import Ops, UOp, buffers, sym_infer

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


# ---- graph specs: a captured CPU graph as the launcher runs it (what the graph cache stores, graphcache.py) ----

Arg = tuple[str, int | str]  # ("in", input slot) | ("buf", view index) | ("ext", model buffer name)


@dataclass(frozen=True)
class Call:
  program: int                                  # index into GraphSpec.programs
  args: tuple[Arg, ...]                         # the program's buffer parameters, in order
  vars: tuple[tuple[str, int, int], ...]        # its variable parameters after them: (name, vmin, vmax); core_id included
  core: int | None                              # the core_id parameter's slot, if the kernel is split into slices
  slices: int | UOp                             # global size 0: the slice count (a variable expression for some)


@dataclass(frozen=True)
class GraphSpec:
  """One captured graph without tinygrad's UOp graph: its programs' machine code, the buffers it owns (bases with
  their sizes, views into them; constants with their bytes) and its calls. Inputs stay slots, model-owned buffers
  names; `load_graph` makes the buffers and loads the programs, `plan_graph` appends its calls to a Plan."""
  device: str
  programs: tuple[TinyELF, ...]
  bases: tuple[tuple[int, DType, bytes | None], ...]   # (size, dtype, bytes of a constant | None: written before read)
  views: tuple[tuple[int, int, DType, int], ...]       # (base index, size, dtype, offset); a base is a full view of itself
  calls: tuple[Call, ...]
  ret: int                                             # view index of the output
  ret_shape: tuple[int, ...]


def graph_spec(captured: CapturedJit, externals: dict[str, Buffer]) -> GraphSpec | None:
  """The spec of a captured graph, or None if the launcher could not run it (see plan())."""
  if not available():
    return None
  names = {id(b): n for n, b in externals.items()}
  written = {id(buffers[u].base) for u in captured._written_uops if u in buffers}
  programs: dict[int, int] = {}
  elfs: list[TinyELF] = []
  bases: dict[int, int] = {}
  base_rows: list[tuple[int, DType, bytes | None]] = []
  views: dict[int, int] = {}
  view_rows: list[tuple[int, int, DType, int]] = []

  def view(b: Buffer) -> int:
    if id(b) not in views:
      base = b.base
      if id(base) not in bases:
        bases[id(base)] = len(base_rows)
        const = None if id(base) in written else bytes(base.ensure_allocated().as_memoryview())
        base_rows.append((base.size, base.dtype, const))
      views[id(b)] = len(view_rows)
      view_rows.append((bases[id(base)], b.size, b.dtype, b.offset))
    return views[id(b)]

  calls = []
  for call in captured.linear.src:
    ast = call.src[0]
    if ast.op is not Ops.PROGRAM or not isinstance(dev := call.src[1].device, str):
      return None
    rt = get_runtime(dev, ast)
    arg_uops = get_call_arg_uops(call)
    if not isinstance(rt, CPUProgram) or rt.lvp or len(ast.arg.globals) + len(ast.arg.vars) > swactor_ring.LAUNCH_MAX_ARGS:
      return None
    args: list[Arg] = []
    for i in ast.arg.globals:
      u = arg_uops[i]
      if u.op is Ops.PARAM:
        args.append(("in", u.arg.slot))
        continue
      b = u.buffer
      if not isinstance(b, Buffer):
        return None
      args.append(("ext", names[id(b)]) if id(b) in names else ("buf", view(b)))
    if id(ast) not in programs:
      programs[id(ast)] = len(elfs)
      elfs.append(ast.to_elf())
    calls.append(Call(programs[id(ast)], tuple(args), tuple((v.expr, int(v.vmin), int(v.vmax)) for v in ast.arg.vars),
                      rt.runtimevars.get("core_id"), ast.arg.global_size[0]))
  ret = captured.ret.uop.base.buffer
  if not isinstance(ret, Buffer) or id(ret) in names:
    return None
  return GraphSpec(captured.ret.device, tuple(elfs), tuple(base_rows), tuple(view_rows), tuple(calls), view(ret),
                   tuple(captured.ret.shape))


@dataclass
class LoadedGraph:
  spec: GraphSpec
  programs: list[CPUProgram]
  views: list[Buffer]
  externals: dict[str, Buffer]

  @property
  def ret(self) -> Tensor:
    return Tensor(UOp.from_buffer(self.views[self.spec.ret])).reshape(self.spec.ret_shape)


def load_graph(spec: GraphSpec, externals: dict[str, Buffer]) -> LoadedGraph:
  """Allocate the spec's buffers (constants filled in) and load its programs (no compiler runs)."""
  dev = Device[spec.device]
  bases = []
  for size, dtype, const in spec.bases:
    b = Buffer(spec.device, size, dtype).allocate()
    if const is not None:
      b.copyin(memoryview(bytearray(const)))
    bases.append(b)
  views = [bases[i] if (off == 0 and size == bases[i].size and dtype == bases[i].dtype)
           else Buffer(spec.device, size, dtype, base=bases[i], offset=off).ensure_allocated()
           for i, size, dtype, off in spec.views]
  missing = {a[1] for c in spec.calls for a in c.args if a[0] == "ext"} - set(externals)
  if missing:
    raise KeyError(f"the graph reads model buffers {sorted(missing)} this model does not have")
  return LoadedGraph(spec, [dev.runtime(elf) for elf in spec.programs], views, externals)  # type: ignore[misc]


def plan_graph(g: LoadedGraph, inputs: list[Buffer], into: Plan) -> bool:
  """Like plan(), from a loaded spec: append its calls, bound to `inputs`, to `into`."""
  if into.table is None:
    return False
  for c in g.spec.calls:
    rt = g.programs[c.program]
    bufs = [inputs[v] if kind == "in" else g.externals[v] if kind == "ext" else g.views[v]  # type: ignore[index]
            for kind, v in c.args]
    bufs = [b.ensure_allocated() for b in bufs]
    i = into.table.push(rt.addr, [b.get_buf(g.spec.device).va_addr for b in bufs] + [0] * len(c.vars), c.core,
                        c.slices if isinstance(c.slices, int) else 0)
    if c.core is not None and not isinstance(c.slices, int):
      into.sym_slices.append((i, c.slices))
    for j, (name, lo, hi) in enumerate(c.vars):
      if name != "core_id":
        into.table.bind(name, i, len(bufs) + j, lo, hi)
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
