"""[worker] table of /etc/swactor/swactor.toml."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR, ConfigError


@dataclass
class WorkerConfig(sockets.EdgeEndSockets):
    # TCP listener of the node control API (stage.proto), mutual TLS.
    control_address: str = "0.0.0.0:7441"
    # host:port the orchestrator should dial (gossiped as control_endpoint); "" = control_address.
    advertise_control: str = ""
    # The only orchestrator node id allowed to provision this node; 0 = any holder of the secret.
    orchestrator_node_id: int = 0
    secret_file: Path = Path("/etc/swactor/cluster.secret")
    state_dir: Path = DEFAULT_STATE_DIR
    membership_socket: Path = sockets.MEMBERSHIP
    # tinygrad device for the compute process ("" = CUDA when nvidia-smi lists a GPU, else CPU: membership/gpus.py).
    device: str = ""
    # Stage devices (docs/operations.md "Several GPUs per host"): one stage controller and compute process each, so the
    # node carries that many consecutive stages of a run with the edges between them inside the host. 0 = one per GPU
    # nvidia-smi lists when `device` is CUDA (or detected), else 1. Several on a CPU device share its cores and memory.
    stage_devices: int = 0
    # CPU cores the compute process's matvec kernels split over (CPU device); 0 = auto: the cores the
    # process may use, at most 8, shared out between the stage devices. Set it when several workers share one machine.
    compute_threads: int = 0
    # Device memory stages may use on this node, advertised to the orchestrator's planner with
    # NodeAvailable, per stage device; 0 = measured (worker/stage_memory.py: each GPU's free memory (the least of
    # them), or 80 % of MemAvailable on a CPU device, shared out between its stage devices). Set it when several
    # workers share one machine.
    memory_bytes: int = 0
    # Device memory the compute process may allocate (weights, KV cache, activations), for GPUs shared with other
    # tenants; an allocation past it fails as the device's own out-of-memory does (the run faults
    # RUN_FAULT_DEVICE_OUT_OF_MEMORY). 0 = the device's own limit. Also caps a measured memory_bytes.
    device_memory_limit_bytes: int = 0
    # The weights cache (docs/distribution.md): where fetched GGUF ranges are kept (None =
    # <state_dir>/weights), its size limit in bytes (0 = no limit but the disk), and how long a fetch
    # from the orchestrator's model server may receive nothing before it fails.
    weights_cache_dir: Path | None = None
    weights_cache_bytes: int = 0
    weights_stall_timeout_s: float = 30.0
    # HTTP connections one fetch uses in parallel (decryption, hashing and writing then use more cores).
    weights_connections: int = 4
    # Compiled decode / prefill graphs of the compute process (docs/compute.md "Compile before the barrier"): a stage
    # loads them from here instead of compiling (seconds -> ~0.1 s). None = $XDG_CACHE_HOME/swactor-graphs (the unit's
    # CacheDirectory), else ~/.cache/swactor-graphs; graph_cache = false compiles at every load.
    graph_cache_dir: Path | None = None
    graph_cache: bool = True
    init_timeout_s: float = 120.0
    stop_timeout_s: float = 10.0
    # The orchestrator's hold on a run (worker/stage_lease.py): with no WatchStage stream of the run
    # for this long the stage faults fail-stop and tears itself down (rings released, node free).
    control_lease_s: float = 5.0
    # HTTP/2 keepalive of the control listener: ping every interval, drop a peer silent for two.
    control_keepalive_s: float = 1.0
    # A ring lease the arena keeps queued (memory pressure) this long fails the stage
    # RUN_FAULT_ARENA_PRESSURE_TIMEOUT instead of waiting for the run's readiness timeout.
    arena_pressure_timeout_s: float = 30.0
    # Runs in flight (docs/runs-in-flight.md): a decode row waits up to this long for the rows of the other runs decoding
    # on the stage, so their rows go through it as one batched step (0: never wait; each row goes as soon as the
    # compute process is free).
    batch_gather_ms: float = 10.0
    # A run alone on a stage decodes under a standing grant of its steps (docs/worker.md "Step grants"): its decode
    # step starts as its input loads, without a round trip through the node service. false: every step waits for
    # its ExecuteStep (for comparison).
    step_grants: bool = True

    def __post_init__(self) -> None:
        if self.stage_devices < 0:
            raise ConfigError(f"[worker].stage_devices: must be >= 0 (0 = one per GPU), got {self.stage_devices}")
        if self.compute_threads < 0:
            raise ConfigError(f"[worker].compute_threads: must be >= 0 (0 = auto), got {self.compute_threads}")
        if not 0 <= self.batch_gather_ms <= 1000:
            raise ConfigError(f"[worker].batch_gather_ms: must be 0..1000, got {self.batch_gather_ms}")
        if self.weights_connections < 1:
            raise ConfigError(f"[worker].weights_connections: must be >= 1, got {self.weights_connections}")
        if self.control_lease_s <= 0 or self.control_keepalive_s <= 0:
            raise ConfigError(f"[worker].control_lease_s / control_keepalive_s: must be > 0, got "
                              f"{self.control_lease_s} / {self.control_keepalive_s}")
        if self.memory_bytes < 0:
            raise ConfigError(f"[worker].memory_bytes: must be >= 0 (0 = measured), got {self.memory_bytes}")
        if self.device_memory_limit_bytes < 0:
            raise ConfigError(f"[worker].device_memory_limit_bytes: must be >= 0 (0 = the device's own), "
                              f"got {self.device_memory_limit_bytes}")
        if self.weights_cache_bytes < 0:
            raise ConfigError(f"[worker].weights_cache_bytes: must be >= 0 (0 = no limit), got {self.weights_cache_bytes}")

    def backend(self, device: str | None = None, threads: int | None = None) -> dict[str, object]:
        """InitializeWorker.backend (§29) of a compute process: on `device` (None: [worker].device) with `threads`
        kernel threads (None: [worker].compute_threads)."""
        out: dict[str, object] = {}
        device = self.device if device is None else device
        threads = self.compute_threads if threads is None else threads
        if device:
            out["device"] = device
        if threads:
            out["threads"] = threads
        if self.device_memory_limit_bytes:
            out["memory_limit"] = self.device_memory_limit_bytes
        out["graph_cache"] = str(self.graph_cache_path()) if self.graph_cache else ""
        return out

    def graph_cache_path(self) -> Path:
        if self.graph_cache_dir is not None:
            return self.graph_cache_dir
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swactor-graphs"
