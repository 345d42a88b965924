"""The llama stage role: a contiguous GGUF layer range run by the compute core's StageModel.

ConfigureRole.config for kind "llama_stage":
  gguf_path, gguf_sha256 ("" = unchecked), layer_start, layer_end (exclusive), max_seq_len,
  hidden_dim (checked against the GGUF), sampling {temperature, top_k, top_p, seed} (last stage),
  prefill_chunk (rows per prefill step the stage compiles for; default 1: prompts run row by row),
  slots (runs in flight the stage holds, one KV cache slot each; default 1), slot (the run's slot; default 0:
  ConfigureRole of a resident role resets that slot alone, docs/runs-in-flight.md), kv_dtype (the KV cache's
  storage: "float32", default, or "float16", stored half and read back as float32).
The load reports progress (phase "weights": 0/N once the GGUF is parsed, then once per layer), then
compiles every graph a step runs before it answers (phase "compile", StageModel.prepare: the
stage is ready only when its first step can run at full speed, a batched step of several runs in flight
too: a step that compiled would stall every run for seconds); the progress callback may raise to
abandon the load (role_loader). Compute threads and the compiled-graph cache come from
InitializeWorker.backend.
Inputs/outputs are flat device objects: int32 token ids [T] into the first stage, float32
activations [T, hidden] between stages, one int32 token id out of the last stage (one per row with every_row).
A step of one input runs one run's rows: runtime {start_pos, sample, slot, rewind, every_row}. A step of several
inputs is a batched decode step, one row of each of several runs: runtime {"rows": [{slot, start_pos, sample,
rewind}, ...]} in the inputs' order, one output per input. rewind (default 0): the run's positions dropped before
its rows (rejected drafts, objflags); every_row (default false): the last stage samples after every row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from swactor.v1 import common_pb2 as pb
from swactor.worker.process import failures
from swactor.worker.process.device import DeviceAllocation, DeviceBridge
from swactor.worker.process.roles import Progress, RoleError, check_weights_file


def _int(config: dict[str, Any], name: str) -> int:
    v = config.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.{name} must be a non-negative integer, got {v!r}")
    return v


def sampling_policy(config: dict[str, Any]) -> Any:
    from swactor.common.sampling import SamplingPolicy

    s = config.get("sampling") or {}
    if not isinstance(s, dict) or set(s) - {"temperature", "top_k", "top_p", "seed", "skip_draws"}:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID,
                        f"config.sampling {s!r}: keys are temperature, top_k, top_p, seed, skip_draws")
    try:
        return SamplingPolicy(**s)
    except (TypeError, ValueError) as e:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.sampling: {e}") from None


class LlamaStageRole:
    def __init__(self, model: Any, bridge: DeviceBridge, key: tuple[Any, ...]) -> None:
        self.model = model
        self.bridge = bridge
        self.key = key

    @classmethod
    def load(cls, config: dict[str, Any], bridge: DeviceBridge, progress: Progress,
             key: tuple[Any, ...], *, threads: int | None = None, graph_cache: str = "") -> LlamaStageRole:
        from swactor.worker.compute import GGUFModel, ModelRefused, StageModel, UnsupportedQuant
        from swactor.worker.compute.graphcache import GraphCache
        from swactor.worker.compute.model import KV_DTYPES

        path = check_weights_file(config.get("gguf_path"), config.get("gguf_sha256", ""))
        start, end, max_seq = _int(config, "layer_start"), _int(config, "layer_end"), _int(config, "max_seq_len")
        chunk = config.get("prefill_chunk", 1)
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.prefill_chunk must be a positive integer, got {chunk!r}")
        policy = sampling_policy(config)
        slots = config.get("slots", 1)
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.slots must be a positive integer, got {slots!r}")
        _slot(config, slots)  # checked before the load: a bad slot is the config's error, not a later step's
        kv_dtype = config.get("kv_dtype", "float32")
        if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:  # before the load (StageModel: after the parse)
            raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID,
                            f"config.kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
        try:
            gguf = GGUFModel(path)  # metadata + tensor index: seconds for a big file, no progress inside
            progress(0, max(0, end - start))  # parsed: the layers come next (a cancelled load stops here)
            model = StageModel(gguf, start, end, max_seq_len=max_seq, device=bridge.device, sampling=policy,
                               threads=threads, prefill_chunk=chunk, slots=slots, kv_dtype=kv_dtype,
                               graph_cache=GraphCache(graph_cache) if graph_cache else None,
                               on_progress=lambda p: progress(p.layers_loaded, p.layers_total))
        except (ModelRefused, UnsupportedQuant) as e:
            raise RoleError(pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED, f"{path}: {e}") from None
        except ValueError as e:
            raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"layers [{start}, {end}) of {path}: {e}") from None
        except (OSError, MemoryError) as e:  # out of device memory is one of these (failures.py): by the same table
            reason = failures.classify(failures.LOAD_FAILURES, e).reason
            cause = f" ({e.__cause__})" if e.__cause__ is not None else ""  # e.g. the device memory limit's word
            raise RoleError(reason, f"{path}: layers [{start}, {end}): {type(e).__name__}: {e}{cause}") from None
        hidden = config.get("hidden_dim")
        if hidden is not None and hidden != model.hidden_dim:
            raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"plan says hidden_dim {hidden}, {path} has {model.hidden_dim}")
        model.prepare(lambda done, total: progress(done, total, "compile"))  # before RoleConfigured: see the module doc
        return cls(model, bridge, key)

    def step(self, inputs: list[DeviceAllocation], runtime: dict[str, Any]) -> list[DeviceAllocation]:
        if len(inputs) > 1 or "rows" in runtime:
            return self._batch(inputs, runtime)
        (x,) = inputs
        slot, start_pos, sample, rewind = _row(runtime, "runtime")
        every_row = runtime.get("every_row", False)
        if not isinstance(every_row, bool):
            raise ValueError(f"runtime.every_row must be a boolean, got {every_row!r}")
        self.model.rewind(slot, rewind)
        out = self.model.step(self._array(x), start_pos, sample=sample, slot=slot, every_row=every_row)
        return [self._object(out)]

    @property
    def layers_seconds(self) -> float | None:
        return self.model.last_layers_s

    def _batch(self, inputs: list[DeviceAllocation], runtime: dict[str, Any]) -> list[DeviceAllocation]:
        from swactor.worker.compute.model import BatchRow

        rows = runtime.get("rows")
        if not isinstance(rows, list) or len(rows) != len(inputs):
            raise ValueError(f"runtime.rows must list one {{slot, start_pos, sample}} per input ({len(inputs)}), "
                             f"got {rows!r}")
        batch, rewinds = [], []
        for i, (r, x) in enumerate(zip(rows, inputs, strict=True)):
            slot, start_pos, sample, rewind = _row(r, f"runtime.rows[{i}]")
            rewinds.append((slot, rewind))
            batch.append(BatchRow(slot, start_pos, self._array(x), sample))
        for slot, rewind in rewinds:
            self.model.rewind(slot, rewind)
        return [self._object(out) for out in self.model.step_batch(batch)]

    def _array(self, x: DeviceAllocation) -> np.ndarray:
        if self.model.is_first:
            return self.bridge.to_numpy(x, np.dtype(np.int32))
        return self.bridge.to_numpy(x, np.dtype(np.float32)).reshape(-1, self.model.hidden_dim)

    def _object(self, out: np.ndarray) -> DeviceAllocation:
        return self.bridge.from_numpy(out.astype(np.int32 if self.model.is_last else np.float32, copy=False))

    def reset(self, config: dict[str, Any]) -> None:
        self.model.reset(sampling_policy(config), slot=_slot(config, self.model.slots))


def _slot(config: dict[str, Any], slots: int) -> int:
    slot = config.get("slot", 0)
    if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < slots:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.slot must be one of the stage's {slots} slot(s), got {slot!r}")
    return slot


def _row(r: Any, where: str) -> tuple[int, int, bool, int]:
    """(slot, start_pos, sample, rewind) of one run's rows in a step's runtime; ValueError (a step failure) names the
    field."""
    if not isinstance(r, dict):
        raise ValueError(f"{where} must be an object, got {r!r}")
    slot, start_pos, sample, rewind = r.get("slot", 0), r.get("start_pos"), r.get("sample", True), r.get("rewind", 0)
    if not isinstance(start_pos, int) or isinstance(start_pos, bool):
        raise ValueError(f"{where}.start_pos must be an integer, got {start_pos!r}")
    if not isinstance(slot, int) or isinstance(slot, bool):
        raise ValueError(f"{where}.slot must be an integer, got {slot!r}")
    if not isinstance(sample, bool):
        raise ValueError(f"{where}.sample must be a boolean, got {sample!r}")
    if not isinstance(rewind, int) or isinstance(rewind, bool) or rewind < 0:
        raise ValueError(f"{where}.rewind must be a non-negative integer, got {rewind!r}")
    return slot, start_pos, sample, rewind
