"""What the workers can run: the ONE declaration the orchestrator judges a model against and the
compute core loads by.

Data only (no import of swactor.worker or swactor.orchestrator), so the orchestrator can refuse a
model at start and at SubmitRun from its header alone, before any host fetches a byte, and a stage
host can tell which tensors its layer range needs. The compute core takes its architectures (and
their rotation), the tensors it reads and the quant types it loads (packed or expanded) from here.
To support a new architecture, tokenizer model or quant type, extend the tables here and the
compute/tokenizer code that implements it; tests/modelfile/test_support.py checks that the compute
core and the tokenizer implement every entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """A `general.architecture` the compute core implements.

    Tensor names are GGUF names: per-layer names are relative to `blk.<i>.`."""

    name: str
    # Every block has all of these.
    layer_tensors: tuple[str, ...]
    # Groups of per-layer tensors a file has either all of or none of (e.g. qwen2's Q/K/V biases).
    optional_layer_groups: tuple[tuple[str, ...], ...] = ()
    # Global tensors by the stage that needs them: the first stage embeds tokens, the last applies the
    # final norm and the head (`output.weight`, or the embedding when the head is tied to it).
    first_stage: tuple[str, ...] = ("token_embd.weight",)
    last_stage: tuple[str, ...] = ("output_norm.weight",)
    head: str = "output.weight"
    tied_head: str = "token_embd.weight"
    # Global tensors every stage reads when the file has them (llama3-style rope frequency divisors).
    every_stage_optional: tuple[str, ...] = ("rope_freqs.weight",)
    # Q/K rotate as NeoX does (x[i], x[i + rope_dim/2]) rather than llama.cpp's adjacent pairs.
    rope_neox: bool = False
    # Each head's Q and K vector is RMS-normed (QK_NORM, weights [head_dim], the file's rms eps) before the rotation.
    qk_norm: bool = False
    # Q, K and V are one matrix (ATTN_QKV: Q's rows, then K's, then V's) and gate and up one matrix (FFN_GATE_UP:
    # the gate's rows, then up's, as llama.cpp's swiglu halves it); the compute splits them by rows at load (phi3).
    fused_qkv_gate_up: bool = False
    # Gemma's block: the first stage scales the embedding rows by sqrt(embedding_length); the attention and the FFN
    # outputs are RMS-normed (POST_NORMS) before each residual add; the gate goes through GELU (tanh approximation),
    # not SiLU. GGUF norm weights already hold Gemma's 1 + w (the converter adds it), so every norm is the plain x*rms*w.
    embed_scale: bool = False
    post_norms: bool = False
    gelu: bool = False
    # Sliding-window attention as llama.cpp sets it per layer: with a window W (`{arch}.attention.sliding_window`, else
    # `swa_window`; 0: none) a query at position p sees keys p-W+1..p on every layer but each period-th (layer i is
    # global when i % period == period - 1; the period is `{arch}.attention.sliding_window_pattern`, else `swa_period`).
    swa_period: int = 0
    swa_window: int = 0
    # The sliding-window layers' RoPE base when the file has no `{arch}.rope.freq_base_swa`, and they take no rope
    # scaling (gemma3: 10000, the global layers keep the file's base and scaling); None: the global layers' base and
    # scaling (gemma2).
    swa_rope_base: float | None = None
    # Soft-caps, tanh(s / c) * c, of the attention scores and of the final logits: None, not applied; else c's default
    # when the file has no `{arch}.attn_logit_softcapping` / `{arch}.final_logit_softcapping` (0: off).
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # Files of this block count scale the attention scores by 1/sqrt(embedding_length / head_count) instead of
    # 1/sqrt(head_dim): Gemma's 27B query_pre_attn_scalar, which the GGUF does not carry (llama.cpp infers it so).
    dim_scaled_attention_layers: int = 0
    # Mixture of Experts (EXPERT_FFN: a router and every expert's gate/up/down stacked in one tensor each, in place of
    # the dense DENSE_FFN): "never"; "always" (qwen3moe, whose `layer_tensors` name the experts); "optional" (llama:
    # Mixtral-style files are `llama` with experts, told apart by `{arch}.expert_count` > 0; their blocks all have
    # experts). The router softmaxes its logits, takes the top `{arch}.expert_used_count` and renormalises their
    # weights unless `{arch}.expert_weights_norm` is false (llama.cpp's build_moe_ffn for both families).
    moe: str = "never"

    def block_tensors(self, experts: bool) -> tuple[str, ...]:
        """Every block's tensors; a file with experts has EXPERT_FFN where the dense block has DENSE_FFN."""
        if not experts or self.moe != "optional":
            return self.layer_tensors
        return tuple(t for t in self.layer_tensors if t not in DENSE_FFN) + EXPERT_FFN

    def known_layer_tensors(self, experts: bool = False) -> frozenset[str]:
        return frozenset(self.block_tensors(experts)) | {t for g in self.optional_layer_groups for t in g}

    def known_global_tensors(self) -> frozenset[str]:
        return frozenset((*self.first_stage, *self.last_stage, self.head, self.tied_head, *self.every_stage_optional))


_LLAMA_LAYER = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
DENSE_FFN = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
# A Mixture-of-Experts FFN: the router [n_experts, embedding_length] and the experts' matrices stacked,
# [n_experts, expert_ffn, embedding_length] (gate, up) and [n_experts, embedding_length, expert_ffn] (down).
EXPERT_FFN = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
# `{arch}.expert_gating_func` values the router implements (llama.cpp's enum: 1 softmax, 2 sigmoid, 3 softmax_weight).
EXPERT_GATING_SOFTMAX = 1

# Q/K/V biases: a qwen2 file has all three in every block (or, for the compute, none at all).
QKV_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")

# Per-head Q/K RMS norm weights: every block of a qwen3 file has both.
QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")

# Gemma's norms of the attention output and of the FFN output, [embedding_length] each, before the residual adds.
POST_NORMS = ("post_attention_norm.weight", "post_ffw_norm.weight")

# phi3's fused matrices: [n_heads*head_dim + 2*n_kv_heads*head_dim, dim] Q/K/V rows and [2*ffn, dim] gate/up rows.
ATTN_QKV, FFN_GATE_UP = "attn_qkv.weight", "ffn_up.weight"
_PHI3_LAYER = ("attn_norm.weight", ATTN_QKV, "attn_output.weight", "ffn_norm.weight", FFN_GATE_UP, "ffn_down.weight")

# LongRoPE ("su"/"longrope": Phi-3 128k, Phi-3.5, Phi-4-mini): two sets of per-frequency divisors, [rope_dim/2] each,
# one file-wide tensor per set. A stage turns by the long set when its context (max_seq_len) exceeds
# `{arch}.rope.scaling.original_context_length`, else by the short one, and scales cos/sin by
# `{arch}.rope.scaling.attn_factor` (params.read_params checks them; worker/compute/rope.py applies them). Only phi3
# declares them (llama.cpp loads them for no other architecture we run).
LONGROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")

# Hyper-parameters are read from keys prefixed by the architecture's name. Mistral files are `llama`.
# An architecture is the llama block plus the shared parts it declares: Q/K/V biases (qwen2), NeoX rotation
# (qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3), per-head Q/K norm (qwen3, qwen3moe, gemma3), experts (qwen3moe; llama
# files with expert tensors: Mixtral), fused Q/K/V and gate/up matrices (phi3), Gemma's
# scaled embedding, post-norms, GELU gate, sliding windows and soft-caps (gemma2, gemma3);
# `{arch}.attention.key_length` may set a head_dim other than embedding_length / head_count (qwen3's usual case).
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", _LLAMA_LAYER, moe="optional"),
    Architecture("qwen2", _LLAMA_LAYER, optional_layer_groups=(QKV_BIAS,), rope_neox=True),
    Architecture("qwen3", _LLAMA_LAYER + QK_NORM, rope_neox=True, qk_norm=True),
    # Qwen3-MoE: qwen3's attention, every block's FFN a Mixture of Experts (no shared expert, as in llama.cpp)
    Architecture("qwen3moe", tuple(t for t in _LLAMA_LAYER if t not in DENSE_FFN) + QK_NORM + EXPERT_FFN,
                 rope_neox=True, qk_norm=True, moe="always"),
    # Phi-3 / Phi-3.5 / Phi-4-mini long-context files add LongRoPE's two factor sets (every stage builds its tables)
    Architecture("phi3", _PHI3_LAYER, every_stage_optional=("rope_freqs.weight", *LONGROPE_FACTORS), rope_neox=True,
                 fused_qkv_gate_up=True),
    # llama.cpp's gemma2 reads its head from the embedding only (an output.weight would go unread: refused)
    Architecture("gemma2", _LLAMA_LAYER + POST_NORMS, head="token_embd.weight", every_stage_optional=(), rope_neox=True,
                 embed_scale=True, post_norms=True, gelu=True, swa_period=2, swa_window=4096, attn_softcap=50.0,
                 final_softcap=30.0, dim_scaled_attention_layers=46),
    Architecture("gemma3", _LLAMA_LAYER + QK_NORM + POST_NORMS, every_stage_optional=(), rope_neox=True, qk_norm=True,
                 embed_scale=True, post_norms=True, gelu=True, swa_period=6, swa_rope_base=10000.0, final_softcap=0.0,
                 dim_scaled_attention_layers=62),
)}

# `{arch}.rope.scaling.type` values the compute core applies (worker/compute/rope.py). "longrope" is what a file with
# LONGROPE_FACTORS runs as, whether it names the type or (as llama.cpp's converter writes Phi-3) names none.
ROPE_SCALING_TYPES: tuple[str, ...] = ("none", "linear", "yarn", "llama3", "longrope")

# `tokenizer.ggml.model` values the orchestrator's tokenizer implements: byte-level BPE, SentencePiece.
TOKENIZER_MODELS: frozenset[str] = frozenset({"gpt2", "llama"})

# GGML tensor types (gguf.GGMLQuantizationType names) the compute core loads:
# float types, read as float32;
FLOAT_TYPES: tuple[str, ...] = ("F32", "F16", "BF16")
# block types kept packed on the device and dequantized inside the matvec (worker/compute/linear.py);
PACKED_TYPES: tuple[str, ...] = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
# block types the `gguf` package dequantizes, expanded to float32 at load (4-16x their file bytes).
EXPANDED_TYPES: tuple[str, ...] = ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                                   "TQ1_0", "TQ2_0", "MXFP4", "NVFP4")
QUANT_TYPES: frozenset[str] = frozenset(FLOAT_TYPES + PACKED_TYPES + EXPANDED_TYPES)


def stage_tensors(arch: Architecture, tensor_names: frozenset[str] | set[str], layer_start: int, layer_end: int,
                  num_layers: int) -> list[str]:
    """The tensors a stage of layers [layer_start, layer_end) reads, in file-independent order.

    Every tensor of its blocks (whatever the file has under `blk.<i>.`), the embedding on the first
    stage, the final norm and head (or the tied embedding) on the last, and the every-stage extras."""
    names: list[str] = []
    if layer_start == 0:
        names += [t for t in arch.first_stage if t in tensor_names]
    for i in range(layer_start, layer_end):
        prefix = f"blk.{i}."
        names += sorted(t for t in tensor_names if t.startswith(prefix))
    if layer_end == num_layers:
        names += [t for t in arch.last_stage if t in tensor_names]
        names.append(arch.head if arch.head in tensor_names else arch.tied_head)
    names += [t for t in arch.every_stage_optional if t in tensor_names]
    seen: set[str] = set()
    return [t for t in names if not (t in seen or seen.add(t))]  # a tied head is the embedding: once
