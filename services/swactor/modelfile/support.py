"""What the workers can run: the ONE declaration the orchestrator judges a model against.

Data only (no import of swactor.worker or swactor.orchestrator), so the orchestrator can refuse a
model at start and at SubmitRun from its header alone, before any host fetches a byte, and a stage
host can tell which tensors its layer range needs. To support a new architecture, tokenizer model or
quant type, extend the tables here (and the compute/tokenizer code that implements it);
tests/modelfile/test_support.py checks that the compute core agrees with these tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # Metadata keys (after the `<name>.` prefix) the compute core cannot run without.
    required_keys: tuple[str, ...] = field(default=(
        "block_count", "embedding_length", "context_length", "feed_forward_length", "attention.head_count",
        "attention.layer_norm_rms_epsilon"))

    def known_layer_tensors(self) -> frozenset[str]:
        return frozenset(self.layer_tensors) | {t for g in self.optional_layer_groups for t in g}

    def known_global_tensors(self) -> frozenset[str]:
        return frozenset((*self.first_stage, *self.last_stage, self.head, self.tied_head, *self.every_stage_optional))


_LLAMA_LAYER = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", _LLAMA_LAYER),
    # When the compute core gains qwen2 (Q/K/V biases, NeoX rope), add:
    # Architecture("qwen2", _LLAMA_LAYER, optional_layer_groups=(("attn_q.bias", "attn_k.bias", "attn_v.bias"),)),
)}

# `tokenizer.ggml.model` values the orchestrator's tokenizer implements.
TOKENIZER_MODELS: frozenset[str] = frozenset({"gpt2", "llama"})

# GGML tensor types (gguf.GGMLQuantizationType names) the compute core loads.
QUANT_TYPES: frozenset[str] = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"})


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
