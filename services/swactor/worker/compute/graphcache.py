"""A disk cache of captured TinyJit graphs, so a stage's decode and prefill graphs are compiled once per host.

Why: capturing a layer graph is tinygrad scheduling, rewriting and code generation in Python plus a clang (or
NVRTC) compile per kernel: ~5-10 s per width on a 2-core host, of which tinygrad's own disk cache (compiled objects
keyed by source) removes only the compiler part. A `CapturedJit` holds the finished product — the linear of calls,
each with its program's machine code — and unpickles in ~0.1 s.

What is stored: the graph without the model. A graph's inputs (the layer's weights and KV cache, the activation) are
PARAMs and never pickled; buffers the graph reads but the model owns (RoPE tables, the head's weights: `externals`)
are stored as names and bound to the loading model's buffers; buffers the graph writes (memory-planned intermediates,
its output) are stored without their bytes; anything else it reads is a constant and keeps its bytes. Every BUFFER
node gets a fresh slot on load (tinygrad's buffer identity is a per-process counter: a stored slot could name a live
buffer of this process).

Claims: workers of one host that would capture the same graphs at once (a pipeline's stages loading together, a
restarted process) take turns instead: `try_claim` an advisory lock (flock) named for a shape's graphs before capturing
them, and a worker that finds it taken captures its other shapes first, then waits on the `claim` and loads what the
holder stored. A holder that dies releases its lock with its process; a holder that is still busy after CLAIM_WAIT_S
is not waited for any longer (the waiter captures the graphs itself).

Keys: a digest of everything the compiled code depends on — tinygrad's version, this package's source, the device
(and on CPU the processor's model and flags, since clang compiles for the native target), the graph's name, its
input shapes/dtypes, the model's hyper-parameters and the compile settings (threads, BEAM). A change of any of them
is a different file; an entry that cannot be read or bound is a miss (logged, removed) and the graph is captured
again. Entries are written to a temporary name and renamed, so concurrent workers on one host never read half a file.
The directory must be writable only by the service user: an entry holds code that is run (like tinygrad's cache.db).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import io
import os
import pickle
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tinygrad import Device
from tinygrad.device import Buffer
from tinygrad.engine.jit import CapturedJit
from tinygrad.uop.ops import Ops, UOp, buffers

from swactor.common.events import get_logger

from .replay import GraphSpec, LoadedGraph, graph_spec, load_graph

SUFFIX = ".graph"
CLAIM_SUFFIX = ".claim"
CLAIM_WAIT_S = 600.0
CLAIM_POLL_S = 0.05
CLAIM_REPORT_S = 2.0
FORMAT = 1                # bump when what an entry holds changes
LIMIT_BYTES = 512 << 20   # oldest entries are removed beyond this
_STACK_BYTES = 512 << 20  # pickling recurses once per UOp level: a captured linear is thousands deep
_RECURSION = 1_000_000

T = TypeVar("T")


SPEC, JIT = b"swgspec1", b"swgjit01"  # an entry's first 8 bytes: what the pickle after them holds


@functools.cache
def _code_digest() -> str:
  """This package's source: kernels, layouts and the forward are all here."""
  h = hashlib.sha256()
  for p in sorted(Path(__file__).parent.glob("*.py")):
    h.update(p.name.encode() + b"\0" + p.read_bytes())
  return h.hexdigest()


@functools.cache
def _device_identity(device: str) -> str:
  from importlib.metadata import version
  parts = [version("tinygrad"), device, platform.machine()]
  if device.split(":")[0] == "CPU":
    try:
      info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
      parts += [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    except OSError:
      parts.append(platform.processor())
  else:
    dev = Device[device]
    parts.append(str(getattr(dev, "arch", "") or getattr(getattr(dev, "compiler", None), "arch", "")))
  return "\n".join(parts)


def _fresh_buffer_uop(dtype: Any, src: tuple[UOp, ...], arg: Any, tag: Any, buf: Buffer | None, external: bool) -> UOp:
  if external and buf is not None:
    buf.ref(1)  # the loaded graph holds a reference like the capturing one did
  return UOp(Ops.BUFFER, dtype, src, dataclasses.replace(arg, slot=next(UOp.unique_num)), tag, None, buf)


class _Pickler(pickle.Pickler):
  def __init__(self, f: io.BytesIO, externals: dict[str, Buffer], written: set[int]) -> None:
    super().__init__(f, protocol=5)
    self._names = {id(b): name for name, b in externals.items()}
    self._written = written

  def persistent_id(self, obj: Any) -> str | None:
    return self._names.get(id(obj)) if isinstance(obj, Buffer) else None

  def reducer_override(self, obj: Any) -> Any:
    if isinstance(obj, UOp) and obj.op is Ops.BUFFER:
      buf = buffers.get(obj)
      return _fresh_buffer_uop, (obj.dtype, obj.src, obj.arg, obj.tag, buf, buf is not None and id(buf) in self._names)
    if isinstance(obj, Buffer) and obj._base is None and id(obj) in self._written and id(obj) not in self._names:
      return Buffer, (obj.device, obj.size, obj.dtype, None, obj.options)  # written before read: no bytes
    return NotImplemented


class _Unpickler(pickle.Unpickler):
  def __init__(self, f: io.BytesIO, externals: dict[str, Buffer]) -> None:
    super().__init__(f)
    self._externals = externals

  def persistent_load(self, pid: Any) -> Buffer:
    try:
      return self._externals[pid]
    except KeyError:
      raise pickle.UnpicklingError(f"the entry reads model buffer {pid!r}, which this model does not have") from None


_kernel_cache = threading.local()


def kernel_cache_per_thread() -> None:
  """Give each thread its own connection to tinygrad's kernel cache (cache.db). tinygrad keeps one module-wide
  sqlite connection, usable only by the thread that opened it; a stage compiles in its loader thread
  (role_loader.py) and steps, which may still compile, in the main thread. Idempotent."""
  from tinygrad import helpers
  if getattr(helpers.db_connection, "_per_thread", False):
    return
  shared, lock = helpers.db_connection, threading.Lock()

  def db_connection() -> Any:
    conn = getattr(_kernel_cache, "conn", None)
    if conn is None:
      with lock:  # the shared opener makes (and configures) a fresh connection for this thread
        helpers._db_connection = None
        conn = _kernel_cache.conn = shared()
        helpers._db_connection = None
    return conn

  db_connection._per_thread = True  # type: ignore[attr-defined]
  helpers.db_connection = db_connection


def _deep(fn: Callable[[], T]) -> T:
  """Run `fn` on a thread with a big stack and a high recursion limit (pickle recurses in C, once per nesting level)."""
  out: dict[str, Any] = {}

  def run() -> None:
    try:
      out["r"] = fn()
    except BaseException as e:  # handed to the caller's thread
      out["e"] = e

  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(max(limit, _RECURSION))
  old = threading.stack_size(_STACK_BYTES)
  try:
    t = threading.Thread(target=run, name="graph-cache")
    t.start()
    t.join()
  finally:
    threading.stack_size(old)
    sys.setrecursionlimit(limit)
  if "e" in out:
    raise out["e"]
  return out["r"]


@contextlib.contextmanager
def _held(fd: int) -> Iterator[None]:
  try:
    yield
  finally:
    os.close(fd)  # releases the flock


class GraphCache:
  """Captured graphs under `root`, one file per key."""

  def __init__(self, root: str | os.PathLike[str], limit_bytes: int = LIMIT_BYTES) -> None:
    self.root = Path(root)
    self.limit_bytes = limit_bytes
    self.log = get_logger(component="compute")

  def key(self, device: str, name: str, **facts: Any) -> str:
    """The file name of graph `name` on `device` given `facts` (shapes, hyper-parameters, settings): a digest."""
    h = hashlib.sha256(f"swactor graph v{FORMAT}\n{_device_identity(device)}\n{_code_digest()}\n{name}\n".encode())
    for k in sorted(facts):
      h.update(f"{k}={facts[k]!r}\n".encode())
    return h.hexdigest()[:40]

  def _entry(self, key: str) -> Path:
    return self.root / (key + SUFFIX)

  def has(self, key: str) -> bool:
    return self._entry(key).exists()

  def try_claim(self, name: str) -> contextlib.AbstractContextManager[None] | None:
    """The claim on `name` if no other worker holds it (a context manager that releases it), else None. A cache that
    cannot hold claims (its directory cannot be made) claims nothing and says yes: the worker just captures."""
    fd = -1
    try:
      self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
      fd = os.open(self.root / (name + CLAIM_SUFFIX), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      return _held(fd)
    except OSError as e:
      if fd >= 0:
        os.close(fd)
      if isinstance(e, BlockingIOError):  # held by another worker
        return None
      self.log.warning("compute_graph_cache_claim_failed", root=str(self.root), detail=str(e))
      return contextlib.nullcontext()

  @contextlib.contextmanager
  def claim(self, name: str, wait_s: float = CLAIM_WAIT_S, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the claim on `name`, waiting up to wait_s for the worker that holds it; past that, go on without it.
    `waiting` is called every CLAIM_REPORT_S of the wait (a load's progress: it may raise to cancel the wait)."""
    start = time.monotonic()
    reported = start
    while (held := self.try_claim(name)) is None and (now := time.monotonic()) < start + wait_s:
      if waiting is not None and now - reported >= CLAIM_REPORT_S:
        reported = now
        waiting()
      time.sleep(CLAIM_POLL_S)
    if held is None:
      self.log.warning("compute_graph_cache_claim_wait_expired", root=str(self.root), claim=name, waited_s=wait_s)
    with held or contextlib.nullcontext():
      yield

  def load(self, key: str, externals: dict[str, Buffer]) -> LoadedGraph | CapturedJit | None:
    """The entry under `key` bound to this model's `externals`: a loaded launcher graph (CPU) or a CapturedJit."""
    path = self._entry(key)
    try:
      data = path.read_bytes()
    except FileNotFoundError:
      return None
    except OSError as e:
      self.log.warning("compute_graph_cache_unreadable", path=str(path), detail=str(e))
      return None
    try:
      kind, body = data[:8], data[8:]
      if kind == SPEC:
        spec = pickle.loads(body)
        if not isinstance(spec, GraphSpec):
          raise pickle.UnpicklingError(f"holds a {type(spec).__name__}, not a GraphSpec")
        out: LoadedGraph | CapturedJit = load_graph(spec, externals)
      elif kind == JIT:
        out = _deep(lambda: _Unpickler(io.BytesIO(body), externals).load())
        if not isinstance(out, CapturedJit):
          raise pickle.UnpicklingError(f"holds a {type(out).__name__}, not a CapturedJit")
      else:
        raise pickle.UnpicklingError(f"unknown entry kind {kind!r}")
    except Exception as e:  # a corrupt or foreign entry: capture again, and let the new capture replace it
      self.log.warning("compute_graph_cache_entry_dropped", path=str(path), detail=f"{type(e).__name__}: {e}")
      path.unlink(missing_ok=True)
      return None
    os.utime(path)  # recently used: pruned last
    return out

  def store(self, key: str, captured: CapturedJit, externals: dict[str, Buffer]) -> None:
    """Write the entry: the launcher's spec of the graph where it can run it, else the CapturedJit itself (best
    effort: a cache that cannot be written costs the next start a compile, nothing else)."""
    try:
      spec = graph_spec(captured, externals)
      if spec is not None:
        data = SPEC + pickle.dumps(spec, protocol=5)
      else:
        written = {id(b) for u in captured._written_uops if (b := buffers.get(u)) is not None}
        f = io.BytesIO()
        _deep(lambda: _Pickler(f, externals, written).dump(captured))
        data = JIT + f.getvalue()
      self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
      tmp = self.root / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
      tmp.write_bytes(data)
      os.replace(tmp, self._entry(key))
      self._prune()
    except Exception as e:
      self.log.warning("compute_graph_cache_write_failed", root=str(self.root), detail=f"{type(e).__name__}: {e}")

  def _prune(self) -> None:
    entries = []
    for p in self.root.glob("*" + SUFFIX):
      try:
        st = p.stat()
      except FileNotFoundError:  # another worker pruned it
        continue
      entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries):
      if total <= self.limit_bytes:
        break
      p.unlink(missing_ok=True)
      total -= size
