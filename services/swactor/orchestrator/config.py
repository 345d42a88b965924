"""`[orchestrator]` settings (one table of /etc/swactor/swactor.toml); CLI flags override them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR, ConfigError
from swactor.modelfile.memory import DEFAULT_KV_DTYPE
from swactor.orchestrator.models.sources import ModelSource
from swactor.orchestrator.planning.placement import DEFAULT_MAX_SLOTS_PER_STAGE
from swactor.orchestrator.runs.run_messages import Timeouts

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_MODEL_DIR = Path(__file__).resolve().parents[3] / ".cache" / "models"


@dataclass
class OrchestratorConfig(sockets.EdgeEndSockets):
    socket: Path = sockets.ORCHESTRATOR
    # The TCP API ("host:port"), off by default ("": the Unix socket only). When set it serves TLS
    # with tls_cert/tls_key and refuses calls without the bearer token from token_file (0600), see
    # api/api_access.py; `swactor-orchestrator --init-api-access` makes all three.
    tcp_address: str = ""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token_file: Path | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    membership_socket: Path = sockets.MEMBERSHIP
    model_name: str = DEFAULT_MODEL_NAME
    # None: <state_dir>/models/<file>, else the repository's .cache/models/<file>.
    model_path: Path | None = None
    # The default model's source when it is not a local file: an http(s) URL (e.g. a model hub's
    # resolve URL); overrides model_path. docs/distribution.md.
    model_source: str = ""
    # Expected SHA-256 of the default model's file ("" = not checked).
    model_sha256: str = ""
    # More models as "name=SOURCE" or "name=SOURCE sha256=HEX" (SOURCE: an absolute path or a URL).
    models: list[str] = field(default_factory=list)
    # Where URL sources are materialised; None = <state_dir>/model-cache.
    model_cache_dir: Path | None = None
    # The model server stage hosts fetch weights from (HTTPS, mutual TLS from the cluster secret):
    # host:port to bind, and host:port to tell the stages ("" = this node's control host, same port).
    model_server_address: str = "0.0.0.0:7442"
    model_server_advertise: str = ""
    # Manifest piece size in bytes (0 = auto: about 2048 pieces per file, 256 KiB .. 16 MiB).
    manifest_piece_bytes: int = 0
    # A URL source that sends nothing for this long fails the preparation (and the runs waiting on it).
    source_stall_timeout_s: float = 30.0
    # A URL source: stage hosts fetch their byte ranges straight from the URL (verified against this
    # orchestrator's manifest; the model server if the URL fails them), so this host's uplink is not the
    # pool's limit. False: every byte from the model server. docs/distribution.md "Straight from the source".
    stages_fetch_from_source: bool = True
    # The cluster secret: the node control API's mutual TLS derives from it. None = provisioning
    # is not possible (runs fault with RUN_FAULT_PROVISIONING_REJECTED, saying so).
    secret_file: Path | None = None
    # Where the nodes find the default model's GGUF (absolute, node-local); None = model_path.
    node_model_path: Path | None = None
    # Stages of a run that names neither stages nor nodes; 0: the planner's count, the fewest whose memory fits the pool
    # (fewer hops) unless more are predicted 3x quicker a token (placement.stage_count).
    default_stages: int = 0
    max_seq_len: int = 4096
    ring_ceiling_bytes: int = 4 << 20
    # Prompt tokens per prefill chunk: the prompt travels as chunk objects the stages pipeline, and every stage
    # compiles a graph of this many rows before it is ready (docs/orchestrator.md "Prefill chunks"). 0 = the prompt is
    # one object that the stages run row by row.
    prefill_chunk: int = 64
    # The most runs a stage is planned to decode at once, each with its own KV cache (a run slot) over the one copy of
    # the weights; placement gives a stage fewer when its node's memory holds fewer (docs/orchestrator.md "Run
    # slots"). 1..64.
    max_slots_per_stage: int = DEFAULT_MAX_SLOTS_PER_STAGE
    # The dtype every stage keeps its KV cache in: "float32", or "float16" (stored half, read back as float32): a run
    # slot costs half, so a node holds about twice the slots; the measured greedy tokens still equal the float64
    # reference (docs/orchestrator.md "Run slots").
    kv_dtype: str = DEFAULT_KV_DTYPE
    # Whether a slower host gets fewer blocks: the split follows the hosts' measured time per layer when that shortens
    # the slowest stage by a fifth or more (docs/orchestrator.md "Placement"). false: the memory split always, for a
    # pool of hosts of one kind that should never reload weights over a measured difference.
    split_by_speed: bool = True
    pool_window_s: float = 2.0
    # The run FSM's timeouts; their defaults are Timeouts' own.
    pool_timeout_s: float = Timeouts.pool_s
    readiness_timeout_s: float = Timeouts.readiness_s
    readiness_min_fetch_bps: int = Timeouts.readiness_min_fetch_bps
    first_token_timeout_s: float = Timeouts.first_token_s
    step_timeout_s: float = Timeouts.step_s
    teardown_timeout_s: float = Timeouts.teardown_s
    # HTTP/2 keepalive on the channels to the nodes' control API (control_tls.keepalive_options): a
    # dead or partitioned stage host ends its WatchStage stream (and faults the run) within ~3 intervals.
    control_keepalive_s: float = 1.0
    # Reachability of what each node advertises (fleet/reach.py), probed from this host when a node
    # becomes Available: each probe waits reach_timeout_s (or 4 measured round trips to the node, if
    # longer; the edge probe's datagram goes reach_tries times in that time); a node found unreachable
    # is not provisionable and is probed again every reach_retry_s, a reachable one every
    # reach_recheck_s (0: only when its advertised endpoints change).
    reach_timeout_s: float = 3.0
    reach_tries: int = 3
    reach_retry_s: float = 10.0
    reach_recheck_s: float = 60.0
    # A token ring lease the local arena keeps queued this long faults the run RUN_FAULT_ARENA_PRESSURE_TIMEOUT.
    arena_pressure_timeout_s: float = 30.0
    # Bounds (docs/orchestrator.md#bounds): runs waiting behind the active one (a full queue refuses
    # SubmitRun with RESOURCE_EXHAUSTED); the largest SubmitRun accepted, in bytes, checked before
    # parsing or tokenizing; finished runs the run store keeps (the newest runs_max, none older than
    # runs_max_age_s; 0 turns a limit off), their space given back to the file system.
    queue_depth: int = 16
    max_request_bytes: int = 1 << 20
    # Speculative decoding's draft model (docs/orchestrator.md "Speculative decoding"): a small local GGUF with the
    # served models' vocabulary, run in this process on draft_device ("" = tinygrad's default) with draft_slots runs
    # drafting at once; loaded and compiled before the API serves (its graphs cached under state_dir/draft-graphs).
    # None: runs draft by prompt lookup only. Under systemd its unit needs the drop-in of docs/operations.md.
    draft_model: Path | None = None
    draft_device: str = ""
    draft_slots: int = 4
    runs_max: int = 1000
    runs_max_age_s: float = 30 * 86400.0

    def timeouts(self) -> Timeouts:
        return Timeouts(pool_s=self.pool_timeout_s, readiness_s=self.readiness_timeout_s,
                        readiness_min_fetch_bps=self.readiness_min_fetch_bps,
                        first_token_s=self.first_token_timeout_s, step_s=self.step_timeout_s,
                        teardown_s=self.teardown_timeout_s)

    def model_sources(self) -> dict[str, ModelSource]:
        default = self.model_source or (f"{self.model_path}" if self.model_path is not None else "")
        if not default:
            candidates = [self.state_dir / "models" / DEFAULT_MODEL_FILE, REPO_MODEL_DIR / DEFAULT_MODEL_FILE]
            default = str(next((c for c in candidates if c.exists()), candidates[0]))
        if not default.startswith(("http://", "https://")):
            default = str(Path(default).absolute())
        entries = [(self.model_name, f"{default} sha256={self.model_sha256}" if self.model_sha256 else default,
                    "[orchestrator].model_source/model_path/model_sha256")]
        for entry in self.models:
            name, sep, text = entry.partition("=")
            if not sep or not name or not text:
                raise ConfigError(f"[orchestrator].models: {entry!r} is not 'name=SOURCE [sha256=HEX]'")
            entries.append((name.strip(), text, "[orchestrator].models"))
        sources = {}
        for name, text, key in entries:
            try:
                sources[name] = ModelSource.parse(name, text)
            except ValueError as e:
                raise ConfigError(f"{key}: {e}") from None
        return sources

    def model_paths(self) -> dict[str, Path]:
        """The local-path sources (name -> path)."""
        return {n: s.path for n, s in self.model_sources().items() if not s.is_url}
