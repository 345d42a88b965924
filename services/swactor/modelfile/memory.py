"""Device memory of a stage, estimated from the GGUF header alone (the orchestrator plans by it).

The weights are counted as the compute core lays them out (worker/compute/linear.py, model.py): a matrix of a packed
type keeps the file's codes with its scales widened (DEVICE_BLOCK_BYTES per block), any other matrix and every
vector (norms, biases) is float32. Per stage of blocks [start, end):
  weights   its blocks' tensors (phi3's fused Q/K/V and gate/up as they are: the compute splits them by rows and
            stacks the parts again, the same bytes; a Mixture-of-Experts block's every expert, though a token reads
            only the k it routes to: all of them are on the device); the first stage also the token embedding (kept as the file's bytes on the host,
            only the rows of a step's tokens are dequantized), the last the final norm and the head (`output.weight`,
            or the embedding again, in device form, when the head is tied to it)
  kv_cache  one run slot's KV cache (`MemoryProfile.kv_slot_bytes`): K and V of every block for max_seq_len positions
            plus one prefill chunk of padding room, in the KV dtype ([orchestrator].kv_dtype: float32, or float16 at
            half); a stage holds one per run it decodes at once. A sliding-window block (gemma2/gemma3) keeps only
            `swa_cache_positions` of them, a ring over its window, when that is fewer
  scratch   the jitted graphs' buffers for a decode row and a prefill chunk (residual stream, QKV, attention scores,
            FFN), the RoPE tables (gemma3's sliding-window layers have their own) and the last stage's logits row
  runtime   a fixed allowance for the compute process's own runtime (a CUDA context; tinygrad and Python on CPU)
Nothing here imports the worker or the orchestrator: both use it (the worker's `device_nbytes`, the planner).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from swactor.common.objflags import MAX_DRAFT
from swactor.modelfile.header import GgufHeader, TensorInfo
from swactor.modelfile.params import read_params
from swactor.modelfile.support import ARCHITECTURES, ATTN_QKV, FFN_GATE_UP, PACKED_TYPES

# Device bytes per block of each type the compute core keeps packed (support.PACKED_TYPES; codes as in the file, d/m
# scales as float32, K-quant and IQ4_XS sub-block scales as bytes); every other type is expanded to float32 at load.
_BLOCK_BYTES = {"Q8_0": 36, "Q4_0": 24, "Q4_1": 24, "Q5_0": 24, "Q5_1": 28, "Q4_K": 152, "Q5_K": 184, "Q6_K": 212,
                "IQ4_NL": 20, "IQ4_XS": 140}
# A packed type declared in support without its device size here fails at import.
DEVICE_BLOCK_BYTES: dict[str, int] = {name: _BLOCK_BYTES[name] for name in PACKED_TYPES}
FLOAT32 = 4
# Bytes per element of each KV cache dtype the compute core can keep (its KV_DTYPES, worker/compute/model.py, are these
# names; a test checks the sizes): float16 is stored half and read back as float32, so only a run slot's bytes change.
KV_DTYPE_BYTES: dict[str, int] = {"float32": FLOAT32, "float16": 2}
DEFAULT_KV_DTYPE = "float32"
MAX_RUN_SLOTS = 64  # the most runs in flight one stage holds (a KV slot each): what a role config may ask for
# Rows of one prefill chunk the estimate leaves room for (KV cache padding, scratch of the chunk's graphs).
PREFILL_ROWS = 64
RUNTIME_BYTES = 256 << 20


def swa_cache_positions(window: int, rows: int, reach: int = MAX_DRAFT) -> int:
    """KV places a sliding-window block keeps as a ring (the compute core's SwaRing, worker/compute/swa_ring.py) for a
    window of `window` positions, steps of up to `rows` rows and rewinds of up to `reach` positions (rejected drafts):
    the cycle window + max(rows, reach) - 1 (neither a step's rows nor drafts taken back overwrite a position a query
    still sees), rows - 1 past it (a step's rows are written contiguously from their start's place), and rows more
    where a step that belongs to no run writes (prepare's captures)."""
    rows = max(1, rows)
    return window + max(rows, reach) + 2 * rows - 2


def uses_ring(window: int, rows: int, max_seq_len: int) -> bool:
    """Whether a sliding-window block keeps its KV as a ring: where that holds fewer places than the context plus a
    chunk of padding, what a global block keeps (the planner's kv_positions and the compute's StageModel agree by
    this rule)."""
    return window > 0 and swa_cache_positions(window, rows) < max_seq_len + rows


def device_nbytes(type_name: str, rows: int, cols: int) -> int:
    """Device bytes of a [rows, cols] matrix of this GGML type as the compute core uploads it."""
    per_block = DEVICE_BLOCK_BYTES.get(type_name)
    if per_block is None:
        return rows * cols * FLOAT32
    block = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    return rows * cols // block * per_block


def tensor_device_bytes(t: TensorInfo) -> int:
    """A matrix per device_nbytes, a vector as float32 (GGUF dims are ne0 first: columns, then rows)."""
    cols, rows = t.dims[0], 1
    for d in t.dims[1:]:
        rows *= d
    if len(t.dims) == 1:
        return cols * FLOAT32
    return device_nbytes(t.type_name, rows, cols)


@dataclass(frozen=True)
class StageBytes:
    weights: int
    kv_cache: int  # one run slot's
    scratch: int
    runtime: int

    @property
    def shared(self) -> int:
        """What the stage holds once whatever its run slots: the weights, the graphs' scratch, the runtime."""
        return self.weights + self.scratch + self.runtime

    @property
    def total(self) -> int:
        """With one run slot: the least the stage can run with."""
        return self.shared + self.kv_cache


@dataclass(frozen=True)
class MemoryProfile:
    """A model's device memory by part; `stage()` adds up what one stage needs."""

    layer_weights: tuple[int, ...]  # device bytes of block i's tensors
    embedding: int  # the first stage's token embedding (file bytes, host side)
    head: int  # the last stage's final norm and head matrix, device form
    kv_width: int  # K plus V values per position per block
    hidden: int
    q_width: int
    ffn: int
    n_heads: int
    rope_dim: int
    vocab: int
    rope_tables: int = 1  # 2: the sliding-window layers turn by tables of their own (gemma3)
    expert_rows: int = 0  # a Mixture-of-Experts block's extra values per row: router logits, routing, the k down outputs
    swa_window: int = 0  # the sliding-window blocks' window (0: none)
    swa_blocks: tuple[bool, ...] = ()  # per block: sliding-window attention (its KV a ring, swa_cache_positions)

    @property
    def num_layers(self) -> int:
        return len(self.layer_weights)

    @functools.cached_property
    def _prefix(self) -> tuple[int, ...]:
        """Cumulative block weights, so that a stage's sum costs O(1) (the planner tries many splits)."""
        return (0, *itertools.accumulate(self.layer_weights))

    def stage(self, start: int, end: int, max_seq_len: int, rows: int = PREFILL_ROWS,
              kv_bytes: int = FLOAT32) -> StageBytes:
        """What a stage of blocks [start, end) needs for a run of max_seq_len positions, its KV cache kv_bytes per
        element (KV_DTYPE_BYTES)."""
        if not 0 <= start < end <= self.num_layers:
            raise ValueError(f"blocks [{start}, {end}) are not within the model's {self.num_layers}")
        positions = max_seq_len + rows
        weights = self._prefix[end] - self._prefix[start]
        weights += self.embedding if start == 0 else 0
        weights += self.head if end == self.num_layers else 0
        kv = self.kv_slot_bytes(start, end, max_seq_len, rows, kv_bytes)
        scratch = sum(self._graph_scratch(t, positions) for t in {1, rows}) + \
            self.rope_tables * positions * self.rope_dim * FLOAT32
        scratch += self.vocab * FLOAT32 if end == self.num_layers else 0
        return StageBytes(weights, kv, scratch, RUNTIME_BYTES)

    def kv_slot_bytes(self, start: int, end: int, max_seq_len: int, rows: int = PREFILL_ROWS,
                      kv_bytes: int = FLOAT32) -> int:
        """One run slot's KV cache on a stage of blocks [start, end): positions x blocks x (K and V: 2 x n_kv_heads x
        head_dim, `kv_width`) x kv_bytes (4: float32, 2: float16, KV_DTYPE_BYTES). The positions are max_seq_len plus
        a prefill chunk because the worker pads a chunk's rows past the last position (StageModel's slot_bytes,
        worker/compute/model.py); a sliding-window block's are its ring's when fewer (kv_positions)."""
        if kv_bytes not in KV_DTYPE_BYTES.values():
            raise ValueError(f"kv_bytes must be one of {sorted(set(KV_DTYPE_BYTES.values()))}, got {kv_bytes}")
        return sum(self.kv_positions(i, max_seq_len, rows) for i in range(start, end)) * self.kv_width * kv_bytes

    def kv_positions(self, block: int, max_seq_len: int, rows: int = PREFILL_ROWS) -> int:
        """KV positions block `block` keeps per run slot: max_seq_len plus a chunk, or a sliding-window block's ring."""
        if block < len(self.swa_blocks) and self.swa_blocks[block] and uses_ring(self.swa_window, rows, max_seq_len):
            return swa_cache_positions(self.swa_window, rows)
        return max_seq_len + rows

    def _graph_scratch(self, t: int, positions: int) -> int:
        """One jitted width's buffers: the input and two alternating outputs of the residual stream, QKV, the
        attention scores and their softmax over every position, the attention output, gate/up and the activation."""
        rows = 3 * self.hidden + self.q_width + self.kv_width + self.q_width + 3 * self.ffn + self.expert_rows
        return (t * rows + 2 * self.n_heads * t * positions) * FLOAT32


def _first_int(value: object, default: int) -> int:
    """A hyper-parameter that may be stored per block (an array): its largest value."""
    if isinstance(value, list):
        return max((int(v) for v in value), default=default)
    return int(value) if value is not None else default


def memory_profile(header: GgufHeader) -> MemoryProfile:
    """The profile of a model the judge accepted (modelfile.judge); ValueError names what it lacks."""
    arch = ARCHITECTURES.get(str(header.get("general.architecture", "")))
    if arch is None:
        raise ValueError(f"architecture {header.get('general.architecture')!r} is not supported")
    tensors = header.tensor_map()
    n = int(header.get(f"{arch.name}.block_count", 0))
    layers = [0] * n
    for t in header.tensors:
        if t.name.startswith("blk."):
            index = t.name.split(".", 2)[1]
            if index.isdigit() and int(index) < n:
                layers[int(index)] += tensor_device_bytes(t)

    def need(name: str) -> TensorInfo:
        if name not in tensors:
            raise ValueError(f"tensor {name!r} is missing")
        return tensors[name]

    embd = need(arch.tied_head)
    head = need(arch.head) if arch.head in tensors else embd
    head_bytes = sum(tensor_device_bytes(need(t)) for t in arch.last_stage) + tensor_device_bytes(head)
    first = sum(need(t).nbytes for t in arch.first_stage)
    n_heads = _first_int(header.get(f"{arch.name}.attention.head_count"), 1)
    if arch.fused_qkv_gate_up:  # phi3: [Q; K; V] and [gate; up] rows in one matrix each (split at load, same bytes)
        qkv, gate_up = need(f"blk.0.{ATTN_QKV}"), need(f"blk.0.{FFN_GATE_UP}")
        head_dim = _first_int(header.get(f"{arch.name}.attention.key_length"), embd.dims[0] // max(1, n_heads))
        q_width, ffn = n_heads * head_dim, gate_up.dims[1] // 2
        kv_width = qkv.dims[1] - q_width
    else:
        q, k, v = (need(f"blk.0.{t}.weight") for t in ("attn_q", "attn_k", "attn_v"))
        q_width, kv_width = q.dims[1], k.dims[1] + v.dims[1]
    expert_rows = 0
    if "blk.0.ffn_up_exps.weight" in tensors:  # experts [n, ffn, dim] (GGUF dims: dim, ffn, n): a row runs k of them
        up_exps = need("blk.0.ffn_up_exps.weight")
        used = _first_int(header.get(f"{arch.name}.expert_used_count"), 1)
        ffn = used * up_exps.dims[1]
        expert_rows = 3 * up_exps.dims[2] + used * embd.dims[0]
    elif not arch.fused_qkv_gate_up:
        ffn = need("blk.0.ffn_up.weight").dims[1]
    rope_dim = _first_int(header.get(f"{arch.name}.rope.dimension_count"), q_width // max(1, n_heads))
    window, swa_blocks = 0, ()
    if arch.swa_period:  # the windows as the compute reads them
        params = read_params(header)
        window, swa_blocks = params.swa_window, params.swa_layers
    return MemoryProfile(
        layer_weights=tuple(layers), embedding=first, head=head_bytes, kv_width=kv_width,
        hidden=embd.dims[0], q_width=q_width, ffn=ffn, n_heads=n_heads, rope_dim=rope_dim,
        vocab=embd.dims[1], rope_tables=2 if arch.swa_rope_base is not None else 1, expert_rows=expert_rows,
        swa_window=window, swa_blocks=swa_blocks,
    )
