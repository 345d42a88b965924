"""Role code the compute process runs on ExecuteStep (spec §29 ConfigureRole, §15 weights).

A role turns the device objects of one step's inputs into the device objects of its outputs.
`load` builds one from ConfigureRole.config (a cold load: seconds to minutes, so the compute process
runs it on a loader thread, `role_loader`). A config whose `weights_key` is the resident role's
re-uses that role instead (warm reuse across runs: same GGUF, same layer range): the core sees the
key match and the shell calls `Role.reset`, which forgets per-run state (KV cache).

config kinds:
- {"kind": "llama_stage", ...}: a contiguous layer range of a GGUF llama model (compute core);
- {"kind": "factory", "factory": "module:callable", ...}: a role built by an importable callable,
  `callable(config, bridge, progress) -> Role` (tests and extensions; ConfigureRole comes only from
  the node's own GpuWorkerCtl).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from swactor.common.reasons import ReasonError
from swactor.v1 import common_pb2 as pb

if TYPE_CHECKING:  # the core reads weights_key without importing tinygrad
    from swactor.worker.process.device import DeviceAllocation, DeviceBridge

Progress = Callable[..., None]  # progress(done, total, phase="weights" | "compile"); may raise LoadCancelled


class RoleError(ReasonError):
    """ConfigureRole failed: reason is a RoleFailure (RoleFailed event)."""


class LoadCancelled(Exception):
    """Raised inside a load (from its progress callback) once the load was cancelled."""


class Role(Protocol):
    key: tuple[Any, ...]

    def step(self, inputs: list[DeviceAllocation], runtime: dict[str, Any]) -> list[DeviceAllocation]: ...

    def reset(self, config: dict[str, Any]) -> None:
        """Forget per-run state (KV cache, sampler RNG) for a new run of `config`; keep the weights."""


def layers_seconds(role: Role) -> float | None:
    """How long the role's last step spent in its model's blocks, where it says (a llama stage's one-row step:
    StageModel.last_layers_s); None for other steps and roles. The host's speed is measured on it (step_speed.py)."""
    seconds = getattr(role, "layers_seconds", None)
    return seconds if isinstance(seconds, float) and seconds > 0 else None


def weights_key(config: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies resident weights: kind, source, checksum, layer range, role position, the KV slots it holds and
    their dtype (a float16 KV cache is a different resident role: its buffers and graphs differ); not the run's slot or
    sampling: runs in other slots of the same stage share the resident role."""
    return (config.get("kind"), config.get("gguf_path"), config.get("gguf_sha256", ""),
            config.get("layer_start"), config.get("layer_end"), config.get("max_seq_len"), config.get("factory"),
            config.get("prefill_chunk", 1), config.get("slots", 1), config.get("kv_dtype", "float32"))


def load(config: dict[str, Any], bridge: DeviceBridge, progress: Progress, *, threads: int | None = None,
         graph_cache: str = "") -> Role:
    """A new role for `config` (cold). threads: CPU cores of the compute kernels (None: the compute core's default);
    graph_cache: the compiled-graph cache directory ("" = compile every time).
    `progress` may raise (LoadCancelled) to abandon the load: the exception propagates."""
    key = weights_key(config)
    kind = config.get("kind")
    if kind == "llama_stage":
        from swactor.worker.process.llama_role import LlamaStageRole

        return LlamaStageRole.load(config, bridge, progress, key, threads=threads, graph_cache=graph_cache)
    if kind == "factory":
        return _from_factory(config, bridge, progress, key)
    raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.kind {kind!r} is not llama_stage or factory")


def _from_factory(config: dict[str, Any], bridge: DeviceBridge, progress: Progress, key: tuple[Any, ...]) -> Role:
    spec = config.get("factory")
    if not isinstance(spec, str) or ":" not in spec:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.factory {spec!r} is not 'module:callable'")
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, f"config.factory {spec!r}: {e}") from None
    role = fn(config, bridge, progress)
    role.key = key
    return role  # type: ignore[no-any-return]


def check_weights_file(path_text: Any, sha256: Any) -> Path:
    """The GGUF path, after checking it exists and (when given) matches its sha256."""
    if not isinstance(path_text, str) or not path_text:
        raise RoleError(pb.ROLE_FAILURE_CONFIG_INVALID, "config.gguf_path must be a non-empty string")
    path = Path(path_text)
    if not path.is_file():
        raise RoleError(pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, f"GGUF file {path} does not exist")
    if sha256:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        if h.hexdigest() != str(sha256).lower():
            raise RoleError(pb.ROLE_FAILURE_WEIGHTS_CHECKSUM_MISMATCH, f"{path}: sha256 {h.hexdigest()} != expected {sha256}")
    return path
