"""The llama stage role: a contiguous GGUF layer range run by the compute core's StageModel.

ConfigureRole.config for kind "llama_stage":
  gguf_path, gguf_sha256 ("" = unchecked), layer_start, layer_end (exclusive), max_seq_len,
  hidden_dim (checked against the GGUF), sampling {temperature, top_k, top_p, seed} (last stage),
  prefill_chunk (rows per prefill step the stage compiles for; default 1: prompts run row by row).
The load reports progress (phase "weights": 0/N once the GGUF is parsed, then once per layer), then
compiles every graph a step runs before it answers (phase "compile", StageModel.prepare: the
stage is ready only when its first step can run at full speed); the progress callback may raise to
abandon the load (role_loader). Compute threads and the compiled-graph cache come from
InitializeWorker.backend.
Inputs/outputs are flat device objects: int32 token ids [T] into the first stage, float32
activations [T, hidden] between stages, one int32 token id out of the last stage.
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
    if not isinstance(s, dict) or set(s) - {"temperature", "top_k", "top_p", "seed"}:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.sampling {s!r}: keys are temperature, top_k, top_p, seed")
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

        path = check_weights_file(config.get("gguf_path"), config.get("gguf_sha256", ""))
        start, end, max_seq = _int(config, "layer_start"), _int(config, "layer_end"), _int(config, "max_seq_len")
        chunk = config.get("prefill_chunk", 1)
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.prefill_chunk must be a positive integer, got {chunk!r}")
        policy = sampling_policy(config)
        try:
            gguf = GGUFModel(path)  # metadata + tensor index: seconds for a big file, no progress inside
            progress(0, max(0, end - start))  # parsed: the layers come next (a cancelled load stops here)
            model = StageModel(gguf, start, end, max_seq_len=max_seq, device=bridge.device, sampling=policy,
                               threads=threads, prefill_chunk=chunk,
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
        (x,) = inputs
        start_pos = runtime.get("start_pos")
        if not isinstance(start_pos, int):
            raise ValueError(f"runtime.start_pos must be an integer, got {start_pos!r}")
        if self.model.is_first:
            arr = self.bridge.to_numpy(x, np.dtype(np.int32))
        else:
            arr = self.bridge.to_numpy(x, np.dtype(np.float32)).reshape(-1, self.model.hidden_dim)
        sample = runtime.get("sample", True)
        if not isinstance(sample, bool):
            raise ValueError(f"runtime.sample must be a boolean, got {sample!r}")
        out = self.model.step(arr, start_pos, sample=sample)
        return [self.bridge.from_numpy(out.astype(np.int32 if self.model.is_last else np.float32, copy=False))]

    def reset(self, config: dict[str, Any]) -> None:
        self.model.reset(sampling_policy(config))
