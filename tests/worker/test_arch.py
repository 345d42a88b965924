"""qwen2 (biases, NeoX rotation, YaRN), qwen3 (per-head Q/K norm, NeoX rotation), phi3 (fused Q/K/V and gate/up,
NeoX rotation, separate head; LongRoPE), Mixture of Experts (qwen3moe, Mixtral-style llama) and llama RoPE variants (Llama 3 rope_freqs, linear scaling): the stage compute on SmolLM2 re-packed (tests/fixtures/gguf_fixtures.py) against the
float64 reference and llama.cpp's recorded greedy tokens (where recorded), at S = 1..3 chained stages."""
from __future__ import annotations

import copy
import json
import pathlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType
from reference import Reference, RefLlama
from test_model import generate

from swactor.modelfile.header import GgufHeader, read_header
from swactor.modelfile.memory import memory_profile
from swactor.worker.compute import StageModel
from swactor.worker.compute.linear import copy_in
from swactor.worker.compute.model import BatchRow
from tests.fixtures import gguf_fixtures

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures/llamacpp_arch_greedy.json"
LLAMACPP = json.loads(FIXTURE.read_text())
FILES = {**gguf_fixtures.ARCH_FILES, **gguf_fixtures.REFERENCE_FILES}
SPLITS = {1: [(0, 30)], 3: [(0, 7), (7, 22), (22, 30)]}  # one stage; a first, an interior and a last one
MAX_SEQ = 128  # the chains' max_seq_len, and so the context the reference runs with (it picks LongRoPE's set)
REF_PROMPTS = {"plain_france": [1780, 314, 260, 3575, 282, 4649, 47], "once": [6403, 1980, 253, 655]}
REF_STEPS = 12
GEMMA = ("gemma2", "gemma3")
REF_NEAR_TIE, LLAMACPP_NEAR_TIE = 0.02, 0.2  # top-2 logit gaps below which a pick may flip


@pytest.fixture(scope="module", params=list(FILES))
def model_file(request: pytest.FixtureRequest) -> tuple[str, str]:
  if not gguf_fixtures.SOURCE.exists():
    pytest.skip(f"{gguf_fixtures.SOURCE} missing (run `make model`)")
  return request.param, str(FILES[request.param]())


@pytest.fixture(scope="module")
def ref_model(model_file: tuple[str, str]) -> Reference:
  # KV-cached float64 results, once per (file, prompt), kept under .cache/reference/
  return Reference(model_file[1], n_ctx=MAX_SEQ)


@pytest.fixture(scope="module")
def reference(ref_model: Reference) -> dict[str, tuple[list[int], list[float]]]:
  return {k: ref_model.greedy(p, REF_STEPS) for k, p in REF_PROMPTS.items()}


@pytest.fixture(scope="module")
def chains(model_file: tuple[str, str]) -> dict[int, list[StageModel]]:
  return {s: [StageModel(model_file[1], a, b, max_seq_len=MAX_SEQ) for a, b in rng] for s, rng in SPLITS.items()}


def top2_gaps(logits: list[np.ndarray]) -> list[float]:
  return [float(np.diff(np.sort(lg)[-2:])[0]) for lg in logits]


@pytest.mark.parametrize("n_stages", list(SPLITS))
def test_greedy_equals_float64_reference(model_file: tuple[str, str], chains: dict[int, list[StageModel]],
                                         reference: dict[str, tuple[list[int], list[float]]], n_stages: int) -> None:
  """Exactly the reference's tokens up to the first step where its top-2 gap is < REF_NEAR_TIE."""
  compared = 0
  for key, prompt in REF_PROMPTS.items():
    want, gaps = reference[key]
    cut = next((i for i, g in enumerate(gaps) if g < REF_NEAR_TIE), len(want))
    assert generate(chains[n_stages], prompt, REF_STEPS)[:cut] == want[:cut], f"{model_file[0]}/{key}"
    compared += cut
  assert compared >= REF_STEPS, f"{model_file[0]}: only {compared} tokens before the reference's near-ties: a weak check"


LOGITS_RTOL = 2e-3  # the compute's prefill logits within this much of the reference's largest, absolute


def compute_prefill_logits(chains: dict[int, list[StageModel]], prompt: list[int]) -> np.ndarray:
  """The one-stage chain's last-position logits after prefilling `prompt`."""
  (m,) = chains[1]
  m.reset()
  return m.step_logits(np.asarray(prompt, np.int32), 0)


def test_logits_close_to_reference(ref_model: Reference, chains: dict[int, list[StageModel]]) -> None:
  """The whole last-position logits row after prefill, not only its argmax (a dropped bias or a wrong rotation shows)."""
  prompt = REF_PROMPTS["plain_france"]
  want = ref_model.prefill_logits(prompt)
  np.testing.assert_allclose(compute_prefill_logits(chains, prompt), want, atol=LOGITS_RTOL * float(np.abs(want).max()))


def assert_another_model(variant: RefLlama, ref_model: Reference, chains: dict[int, list[StageModel]]) -> None:
  """`variant` (the reference with one part left out or changed) is another model: its logits are far from the
  reference's and from the compute's, and it picks other tokens, so a compute that made the same mistake would fail
  test_logits_close_to_reference and test_greedy_equals_float64_reference."""
  prompt = REF_PROMPTS["plain_france"]
  want, other = ref_model.prefill_logits(prompt), variant.logits(variant.hidden(prompt)[-1])
  tol = LOGITS_RTOL * float(np.abs(want).max())
  assert np.abs(other - want).max() > 50 * tol and np.abs(other - compute_prefill_logits(chains, prompt)).max() > 50 * tol
  assert variant.greedy(prompt, REF_STEPS, kv_cache=True)[0] != ref_model.greedy(prompt, REF_STEPS)[0]


@pytest.mark.parametrize("n_stages", list(SPLITS))
def test_greedy_matches_llamacpp_until_near_tie(model_file: tuple[str, str], chains: dict[int, list[StageModel]], n_stages: int) -> None:
  name, path = model_file
  if name not in LLAMACPP["files"]:
    pytest.skip(f"no llama.cpp tokens recorded for {name}")
  rec = LLAMACPP["files"][name]
  assert gguf_fixtures.sha256(path) == rec["sha256"], \
    f"{path} differs from the file llama.cpp ran: rebuild it (delete it) or re-record with packaging/record_llamacpp_arch_fixture.py"
  compared = 0
  for c in rec["cases"]:
    logits: list[np.ndarray] = []
    ours = generate(chains[n_stages], c["prompt_tokens"], len(c["greedy_tokens"]), logits)
    cut = next((i for i, (a, b) in enumerate(zip(c["top2_gap"], top2_gaps(logits), strict=True)) if min(a, b) < LLAMACPP_NEAR_TIE), len(ours))
    assert ours[:cut] == c["greedy_tokens"][:cut], f"{name}/{c['prompt']}: llama.cpp gaps {c['top2_gap'][:cut + 1]}"
    compared += cut
  assert compared >= LLAMACPP["steps"], f"{name}: only {compared} tokens before near-ties: a weak check"


def test_llama3_rule_from_metadata_equals_the_tensor() -> None:
  """A file carrying Llama 3's rule as rope.scaling.* metadata turns Q/K exactly as the one carrying rope_freqs.weight."""
  from swactor.worker.compute import GGUFModel
  from swactor.worker.compute.rope import rope_tables
  if not gguf_fixtures.SOURCE.exists():
    pytest.skip(f"{gguf_fixtures.SOURCE} missing (run `make model`)")
  meta, tensor = GGUFModel(gguf_fixtures.build_llama3_meta()), GGUFModel(gguf_fixtures.build_llama3())
  assert meta.params.rope_scaling.kind == "llama3" and "rope_freqs.weight" not in meta.tensors
  freqs = tensor.tensor("rope_freqs.weight").dequantize()
  for a, b in zip(rope_tables(meta.params, None, 600), rope_tables(tensor.params, freqs, 600), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)  # rope_freqs is stored as float32
  assert not np.allclose(rope_tables(tensor.params, None, 600)[0], rope_tables(tensor.params, freqs, 600)[0], atol=1e-3)


def header(path: str) -> GgufHeader:
  with open(path, "rb") as f:
    return read_header(lambda n: (f.seek(0), f.read(n))[1])[0]


def test_planner_memory_estimate_equals_the_loaded_stages(model_file: tuple[str, str], chains: dict[int, list[StageModel]]) -> None:
  """modelfile.memory counts every block tensor the compute uploads (qwen2's biases, qwen3's Q/K norms)."""
  profile = memory_profile(header(model_file[1]))
  for n_stages, ranges in SPLITS.items():
    for (a, b), m in zip(ranges, chains[n_stages], strict=True):
      want = profile.stage(a, b, MAX_SEQ, rows=1)
      host = m.embd.nbytes if m.is_first else 0
      assert (want.weights - host, want.kv_cache) == (m.memory.device_bytes, m.memory.cache_bytes), (model_file[0], a, b)


def variant(model: RefLlama, drop: tuple[str, ...] = (), **attrs: object) -> RefLlama:
  """`model` with the per-layer tensors `drop` left out of every block (None: not applied) and `attrs` replaced."""
  v = copy.copy(model)
  v.layers = [{**L, **dict.fromkeys(drop)} for L in model.layers]
  vars(v).update(attrs)
  return v


def test_qk_norms_matter(model_file: tuple[str, str], ref_model: Reference, chains: dict[int, list[StageModel]]) -> None:
  """The fixture's per-head Q/K norms change the model: the reference without them is far from the reference with them
  (and from the compute's logits, which test_logits_close_to_reference holds near the latter) and picks other tokens,
  so a compute that skipped or misapplied them would fail the tests above."""
  if "blk.0.attn_q_norm.weight" not in header(model_file[1]).tensor_map():
    pytest.skip(f"{model_file[0]} has no per-head Q/K norms")
  if header(model_file[1]).get("general.architecture") in GEMMA:
    pytest.skip("test_gemma_parts_on_a_small_file checks a Gemma file's Q/K norms with its other parts")
  assert_another_model(variant(ref_model.model, ("attn_q_norm", "attn_k_norm")), ref_model, chains)


def test_qwen3_head_dim_from_key_length(tmp_path: pathlib.Path) -> None:
  """A qwen3 whose head_dim (attention.key_length) is not embedding_length / head_count, its head tied to the
  embedding: a small random float32 file, the compute's logits at 1 and 2 stages equal the float64 reference's."""
  g = gguf_fixtures
  dim, ffn, heads, kv_heads, vocab = g.SMALL_DIM, g.SMALL_FFN, g.SMALL_HEADS, g.SMALL_KV_HEADS, g.SMALL_VOCAB
  hd = dim // heads // 2
  rng = np.random.default_rng(7)
  mat = lambda rows, cols: (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)  # noqa: E731
  vec = lambda n, lo=0.5, hi=1.5: rng.uniform(lo, hi, n).astype(np.float32)  # noqa: E731
  tensors = {"token_embd.weight": mat(vocab, dim), "output_norm.weight": vec(dim)}
  for i in range(g.SMALL_LAYERS):
    tensors |= {f"blk.{i}.{k}.weight": a for k, a in {
      "attn_norm": vec(dim), "attn_q": mat(heads * hd, dim), "attn_k": mat(kv_heads * hd, dim), "attn_v": mat(kv_heads * hd, dim),
      "attn_output": mat(dim, heads * hd), "attn_q_norm": vec(hd, 0.5, 3.0), "attn_k_norm": vec(hd, 0.5, 3.0),
      "ffn_norm": vec(dim), "ffn_gate": mat(ffn, dim), "ffn_up": mat(ffn, dim), "ffn_down": mat(dim, ffn)}.items()}
  fields = [*g.small_fields("qwen3"), *(g.Field(f"qwen3.attention.{k}_length", hd, GGUFValueType.UINT32) for k in ("key", "value"))]
  path = tmp_path / "qwen3-small.gguf"
  g.write_raw(path, "qwen3", fields, {n: (a, QT.F32) for n, a in tensors.items()})
  ref = RefLlama(str(path))
  prompt = [5, 17, 300, 42, 9]
  want = ref.logits(ref.hidden(prompt)[-1])
  for ranges in ([(0, g.SMALL_LAYERS)], [(0, 1), (1, g.SMALL_LAYERS)]):
    chain = [StageModel(path, a, b, max_seq_len=16) for a, b in ranges]
    assert chain[0].params.head_dim == hd != dim // heads and chain[0].params.qk_norm
    x = np.asarray(prompt, np.int32)
    for s in chain[:-1]:
      x = s.step(x, 0)
    np.testing.assert_allclose(chain[-1].step_logits(x, 0), want, atol=1e-4 * float(np.abs(want).max()))


def small_gemma(tmp_path: pathlib.Path, arch: str) -> tuple[pathlib.Path, RefLlama]:
  """A small random float32 `arch` file of two blocks, the first with a sliding window of 3 positions, the second global
  (sliding_window_pattern 2), the head tied; and its float64 reference."""
  g = gguf_fixtures
  dim, ffn, heads, kv_heads, vocab = g.SMALL_DIM, g.SMALL_FFN, g.SMALL_HEADS, g.SMALL_KV_HEADS, g.SMALL_VOCAB
  hd, rng = dim // heads, np.random.default_rng(11)
  mat = lambda rows, cols: (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)  # noqa: E731
  vec = lambda n: rng.uniform(0.5, 1.5, n).astype(np.float32)  # noqa: E731
  tensors = {"token_embd.weight": mat(vocab, dim), "output_norm.weight": vec(dim)}
  for i in range(g.SMALL_LAYERS):
    tensors |= {f"blk.{i}.{k}.weight": a for k, a in {
      "attn_norm": vec(dim), "attn_q": mat(heads * hd, dim) * 3, "attn_k": mat(kv_heads * hd, dim) * 3,
      "attn_v": mat(kv_heads * hd, dim), "attn_output": mat(dim, heads * hd), "post_attention_norm": vec(dim),
      "ffn_norm": vec(dim), "ffn_gate": mat(ffn, dim), "ffn_up": mat(ffn, dim), "ffn_down": mat(dim, ffn),
      "post_ffw_norm": vec(dim), **({"attn_q_norm": vec(hd), "attn_k_norm": vec(hd)} if arch == "gemma3" else {})}.items()}
  u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
  own = {"gemma2": [g.Field("gemma2.attn_logit_softcapping", 1.5, f32), g.Field("gemma2.final_logit_softcapping", 2.0, f32)],
         "gemma3": [g.Field("gemma3.rope.freq_base", 1e5, f32), g.Field("gemma3.rope.scaling.type", "linear", GGUFValueType.STRING),
                    g.Field("gemma3.rope.scaling.factor", 2.0, f32)]}[arch]
  fields = [*(f for f in g.small_fields(arch) if not f.key.endswith(".rope.freq_base") or arch == "gemma2"), *own,
            g.Field(f"{arch}.attention.sliding_window", 3, u32), g.Field(f"{arch}.attention.sliding_window_pattern", 2, u32)]
  path = tmp_path / f"{arch}-small.gguf"
  g.write_raw(path, arch, fields, {n: (a, QT.F32) for n, a in tensors.items()})
  ref = RefLlama(str(path))
  assert ref.local == [True, False] and ref.window == 3
  return path, ref


@pytest.mark.parametrize("arch", GEMMA)
def test_gemma_parts_on_a_small_file(tmp_path: pathlib.Path, arch: str) -> None:
  """Gemma's parts on a small random float32 file of two blocks, the first with a sliding window of 3 positions, the
  second global (sliding_window_pattern 2), the head tied: the compute's prefill logits at 1 stage (row by row) and 2
  stages (chunks of 4 rows, whose rows' windows differ) equal the float64 reference's, and the reference without any one
  part (or with the llama block's choice instead) is another model, so a compute that skipped or misapplied it would
  fail. gemma3: the embedding scale, post-attention and post-FFN norms, GELU, per-head Q/K norms, the window, the
  sliding layer's base 10000 unscaled against the file's 100000 with linear scaling 2 that only the global layer takes;
  gemma2: those but Q/K norms and its own RoPE, plus the soft-caps of the scores and logits (small enough to bite)."""
  path, ref = small_gemma(tmp_path, arch)
  g = gguf_fixtures
  prompt = [5, 17, 300, 42, 9, 77, 128]
  want = ref.logits(ref.hidden(prompt)[-1])
  tol = 1e-4 * float(np.abs(want).max())
  for ranges, chunk in (([(0, g.SMALL_LAYERS)], 1), ([(0, 1), (1, g.SMALL_LAYERS)], 4)):
    chain = [StageModel(path, a, b, max_seq_len=16, prefill_chunk=chunk) for a, b in ranges]
    assert chain[0].params.swa_layers == (True, False)
    x = np.asarray(prompt, np.int32)
    for s in chain[:-1]:
      x = s.step(x, 0)
    np.testing.assert_allclose(chain[-1].step_logits(x, 0), want, atol=tol)
  variants = {"embedding scale": variant(ref, embed_scale=1.0), "post norms": variant(ref, ("post_attention_norm", "post_ffw_norm")),
              "gelu": variant(ref, gelu=False), "window": variant(ref, window=10**9)}
  variants |= {"q/k norms": variant(ref, ("attn_q_norm", "attn_k_norm")), "local rope base": variant(ref, local_base=ref.base),
               "local rope unscaled": variant(ref, local_scaled=True), "global rope scaling": variant(ref, scaling="none")} \
    if arch == "gemma3" else {"attention cap": variant(ref, attn_cap=0.0), "final cap": variant(ref, final_cap=0.0)}
  for name, v in variants.items():
    assert np.abs(v.logits(v.hidden(prompt)[-1]) - want).max() > 50 * tol, name


def test_sliding_window_ring_over_the_whole_context(tmp_path: pathlib.Path) -> None:
  """The sliding block's KV cache as a ring of its window's places (swa_ring.py) on the small gemma3 file, max_seq_len
  32 and prefill chunks of 4: the ring is 25 places, not 36 (a cycle of 18 = window 3 + 16 drafts a rewind may take
  back - 1, where a step's rows run on past it). Two runs at a time in the stage's two slots, every position of the
  context checked against the float64 reference's logits: prompts in chunks (a last chunk padded), then the runs' decode
  rows as batched steps. In the first round run 0 takes back 3 rejected drafts written past the cycle (a later row of
  their positions lands elsewhere) and run 1's prompt leaves position 18 past the cycle; in the second, new runs in both
  slots, the one in slot 1 with a 3-token prompt whose position 18 lands at place 0: a new run sees nothing of the last.
  The planner counts the ring's bytes."""
  path, ref = small_gemma(tmp_path, "gemma3")
  g, max_seq, chunk = gguf_fixtures, 32, 4
  rng = np.random.default_rng(5)
  seqs = [rng.integers(0, g.SMALL_VOCAB, max_seq).tolist() for _ in range(4)]
  wants = [[ref.logits(h) for h in ref.hidden(sq)] for sq in seqs]
  tol = 1e-4 * max(float(np.abs(w).max()) for ws in wants for w in ws)
  a, b = (StageModel(path, lo, hi, max_seq_len=max_seq, prefill_chunk=chunk, slots=2) for lo, hi in ((0, 1), (1, 2)))
  assert a.ring is not None and (a.ring.cycle, a.ring.length) == (18, 25) and b.ring is None  # block 0 slides, 1 global
  profile = memory_profile(header(str(path)))
  for stage, (lo, hi) in ((a, (0, 1)), (b, (1, 2))):
    assert profile.kv_slot_bytes(lo, hi, max_seq, rows=chunk) == stage.memory.slot_bytes
  assert a.memory.slot_bytes * (max_seq + chunk) == b.memory.slot_bytes * a.ring.length  # same widths, fewer places

  def run(texts: tuple[int, int], prompts: tuple[int, int], draft_at: int | None) -> None:
    def check(slot: int, pos: int, acts: np.ndarray) -> None:
      want = wants[texts[slot]][pos + len(acts) - 1]
      np.testing.assert_allclose(b.step_logits(acts, pos, slot=slot), want, atol=tol, err_msg=f"slot {slot} position {pos}")

    for slot in (0, 1):
      a.reset(slot=slot)
      b.reset(slot=slot)
      check(slot, 0, a.step(np.asarray(seqs[texts[slot]][:prompts[slot]], np.int32), 0, slot=slot))
    pos = list(prompts)
    while min(pos) < max_seq:
      if pos[0] == draft_at:  # three drafts of another text (the last past the cycle), then taken back
        b.step_logits(a.step(np.asarray(seqs[3][:3], np.int32), draft_at, slot=0), draft_at, slot=0)
        for stage in (a, b):
          stage.rewind(0, 3)
        draft_at = None
      live = [s for s in (0, 1) if pos[s] < max_seq]
      outs = a.step_batch([BatchRow(s, pos[s], np.asarray(seqs[texts[s]][pos[s]:pos[s] + 1], np.int32)) for s in live])
      for s, out in zip(live, outs, strict=True):
        check(s, pos[s], out)
        pos[s] += 1

  run((0, 1), prompts=(7, 19), draft_at=16)  # the drafts (16-18) at places 16-18, run 1's positions 16-18 too
  run((2, 3), prompts=(5, 3), draft_at=None)  # slot 1's place 18 still holds the last run's position 18


def fused(path: str) -> bool: return "blk.0.attn_qkv.weight" in header(path).tensor_map()


def longrope(path: str) -> bool: return "rope_factors_long.weight" in header(path).tensor_map()


def test_longrope_sets_matter(model_file: tuple[str, str], ref_model: Reference, chains: dict[int, list[StageModel]]) -> None:
  """The fixture's LongRoPE parts change the model: the reference turning by the long set instead of the short one its
  chains' context (MAX_SEQ <= original context) picks, or without the attention factor, is far from the reference (and
  so from the compute's logits, which test_logits_close_to_reference holds within LOGITS_RTOL of it): a compute that
  picked the wrong set or dropped the factor would fail that test. (SmolLM2's greedy tokens survive both, and its
  short set, near 1 where short prompts turn, moves the logits by ~2 tolerances only: test_longrope_on_a_small_file
  shows each part, the short set too, moving a random model's logits by far more.)"""
  if not longrope(model_file[1]):
    pytest.skip(f"{model_file[0]} has no LongRoPE factors")
  m = ref_model.model
  assert m.orig_ctx >= MAX_SEQ and m.divisors is m.short_factors and m.attn_factor > 1
  (stage,) = chains[1]
  assert stage.params.rope_scaling.kind == "longrope"
  prompt = REF_PROMPTS["plain_france"]
  want = ref_model.prefill_logits(prompt)
  tol = LOGITS_RTOL * float(np.abs(want).max())
  got = compute_prefill_logits(chains, prompt)
  for name, v in {"long set": variant(m, divisors=m.long_factors), "no attn_factor": variant(m, attn_factor=1.0)}.items():
    other = v.logits(v.hidden(prompt)[-1])
    assert np.abs(other - want).max() > 10 * tol and np.abs(other - got).max() > 9 * tol, name


def test_longrope_on_a_small_file(tmp_path: pathlib.Path) -> None:
  """LongRoPE on a small random phi3 file (fused Q/K/V and gate/up, the head tied, original context 16, attn_factor
  1.3, seeded sets): a stage of max_seq_len 16 turns by the short set, one of 17 (above the original context) by the
  long set; at 1 and 2 stages the compute's prefill logits equal the float64 reference's run with that context, and
  the two contexts' logits differ, as do those without the attention factor or without the context's set."""
  g = gguf_fixtures
  dim, ffn, heads, kv_heads, vocab = g.SMALL_DIM, g.SMALL_FFN, g.SMALL_HEADS, g.SMALL_KV_HEADS, g.SMALL_VOCAB
  hd, rng = dim // heads, np.random.default_rng(13)
  mat = lambda rows, cols: (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)  # noqa: E731
  vec = lambda n: rng.uniform(0.5, 1.5, n).astype(np.float32)  # noqa: E731
  tensors = {"token_embd.weight": mat(vocab, dim), "output_norm.weight": vec(dim),
             "rope_factors_long.weight": rng.uniform(2.0, 8.0, hd // 2).astype(np.float32),
             "rope_factors_short.weight": rng.uniform(1.0, 2.0, hd // 2).astype(np.float32)}
  for i in range(g.SMALL_LAYERS):
    tensors |= {f"blk.{i}.{k}.weight": a for k, a in {
      # Q's and K's rows scaled up so that the rotation matters
      "attn_norm": vec(dim), "attn_qkv": np.concatenate([mat(heads * hd, dim) * 3, mat(kv_heads * hd, dim) * 3,
                                                         mat(kv_heads * hd, dim)]),
      "attn_output": mat(dim, heads * hd), "ffn_norm": vec(dim), "ffn_up": mat(2 * ffn, dim),
      "ffn_down": mat(dim, ffn)}.items()}
  u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
  fields = [*g.small_fields("phi3"), g.Field("phi3.rope.scaling.original_context_length", 16, u32),
            g.Field("phi3.rope.scaling.attn_factor", 1.3, f32)]
  path = tmp_path / "phi3-longrope-small.gguf"
  g.write_raw(path, "phi3", fields, {n: (a, QT.F32) for n, a in tensors.items()})
  prompt = [5, 17, 300, 42, 9, 77, 128]
  refs = {ctx: RefLlama(str(path), n_ctx=ctx) for ctx in (16, 17)}
  assert refs[16].divisors is refs[16].short_factors and refs[17].divisors is refs[17].long_factors
  wants = {ctx: r.logits(r.hidden(prompt)[-1]) for ctx, r in refs.items()}
  tol = 1e-4 * float(np.abs(wants[16]).max())
  for ctx, want in wants.items():
    for ranges in ([(0, g.SMALL_LAYERS)], [(0, 1), (1, g.SMALL_LAYERS)]):
      chain = [StageModel(path, a, b, max_seq_len=ctx) for a, b in ranges]
      assert chain[0].params.rope_scaling.kind == "longrope" and chain[0].params.rope_scaling.original_context == 16
      x = np.asarray(prompt, np.int32)
      for s in chain[:-1]:
        x = s.step(x, 0)
      np.testing.assert_allclose(chain[-1].step_logits(x, 0), want, atol=tol)
  assert np.abs(wants[16] - wants[17]).max() > 50 * tol  # the set a context picks matters
  for r in refs.values():  # so do the attention factor and the set itself
    for v in (variant(r, attn_factor=1.0), variant(r, divisors=None)):
      assert np.abs(v.logits(v.hidden(prompt)[-1]) - wants[r.n_ctx]).max() > 50 * tol


def test_fused_file_is_the_model_it_repacks(model_file: tuple[str, str], reference: dict[str, tuple[list[int], list[float]]]) -> None:
  """The float64 reference, splitting the fused matrices itself, picks SmolLM2's own tokens (the llama file's
  reference) up to either's first near-tie: the fixture stacks Q/K/V and gate/up in the order the reference (and so
  the compute, held to it above) splits them."""
  if not fused(model_file[1]):
    pytest.skip(f"{model_file[0]} has no fused matrices")
  if longrope(model_file[1]):  # built like phi3 (which checks the order), but LongRoPE turns Q/K otherwise
    pytest.skip(f"{model_file[0]} rotates by LongRoPE's factors: another model than SmolLM2")
  source = Reference(gguf_fixtures.SOURCE)
  compared = 0
  for key, prompt in REF_PROMPTS.items():
    (want, want_gaps), (got, gaps) = source.greedy(prompt, REF_STEPS), reference[key]
    cut = next((i for i, (a, b) in enumerate(zip(want_gaps, gaps, strict=True)) if min(a, b) < REF_NEAR_TIE), REF_STEPS)
    assert got[:cut] == want[:cut], key
    compared += cut
  assert compared >= REF_STEPS


def test_gate_up_order_matters(model_file: tuple[str, str], ref_model: Reference, chains: dict[int, list[StageModel]]) -> None:
  """Taking ffn_up's halves the other way round (up first, then the gate) is another model: its logits are far from
  the reference's and the compute's and its tokens differ, so a compute that split them in the wrong order would fail
  test_greedy_equals_float64_reference."""
  if not fused(model_file[1]):
    pytest.skip(f"{model_file[0]} has no fused matrices")
  m = ref_model.model
  swapped = variant(m, layers=[{**L, "ffn_gate": L["ffn_up"], "ffn_up": L["ffn_gate"]} for L in m.layers])
  assert_another_model(swapped, ref_model, chains)


def moe(path: str) -> bool: return "blk.0.ffn_gate_inp.weight" in header(path).tensor_map()


def test_routing_matters(model_file: tuple[str, str], ref_model: Reference, chains: dict[int, list[StageModel]]) -> None:
  """The router's choice and its renormalisation change the model: the reference running every expert (each by its
  softmax probability) or the top 2 without renormalising is another model, far from the reference and the compute,
  so a compute that computed every expert, picked the wrong ones or skipped the renormalisation would fail above."""
  if not moe(model_file[1]):
    pytest.skip(f"{model_file[0]} has no experts")
  m = ref_model.model
  assert_another_model(variant(m, n_used=len(m.layers[0]["ffn_gate_exps"]), experts_norm=False), ref_model, chains)
  assert_another_model(variant(m, experts_norm=False), ref_model, chains)


def test_only_routed_experts_are_read() -> None:
  """A decode row reads only the experts it routes to: with every other expert's scales set to NaN on the device (in
  every block), the Mixtral-style file's logits for one token still equal the float64 reference's; a one-hot sum over
  every expert would be NaN (0 * NaN). Poisoning one expert the token routes to makes them NaN: the check can fail."""
  if not gguf_fixtures.SOURCE.exists():
    pytest.skip(f"{gguf_fixtures.SOURCE} missing (run `make model`)")
  path = str(gguf_fixtures.build_mixtral())
  ref = Reference(path).model
  routes: list[list[int]] = []

  def record(logits: np.ndarray) -> tuple[list[int], np.ndarray]:
    chosen, w = RefLlama.route(ref, logits)
    p = np.sort(logits)[::-1]
    assert p[ref.n_used - 1] - p[ref.n_used] > 1e-3, "a near-tie in the routing: pick another token"
    routes.append([int(e) for e in chosen])
    return chosen, w

  token = [1780]
  want = variant(ref, route=record).logits(variant(ref, route=record).hidden(token)[-1])
  assert len(routes) == len(ref.layers) and len({tuple(sorted(r)) for r in routes}) > 1  # routes differ by block
  m = StageModel(path, 0, len(ref.layers), max_seq_len=8)
  tol = LOGITS_RTOL * float(np.abs(want).max())

  def poison(layer: int, experts: list[int]) -> None:
    groups = m.layers[layer].kinds[3:]  # gate and up fused per expert (one group), then down
    assert len(groups) == 2
    stacks = m.layers[layer].tensors[-3 * len(groups):]
    for kind, t in zip(groups, (stacks[i:i + 3] for i in range(0, len(stacks), 3)), strict=True):
      assert kind == ("q4",)  # [codes, d, m] of every expert stacked: n_out rows each
      d = t[1].numpy()
      n_out = d.shape[0] // len(ref.layers[layer]["ffn_gate_exps"])
      for e in experts:
        d[e * n_out:(e + 1) * n_out] = np.nan
      copy_in(t[1], d)

  n_experts = len(ref.layers[0]["ffn_gate_exps"])
  for i, chosen in enumerate(routes):
    poison(i, [e for e in range(n_experts) if e not in chosen])
  got = m.step_logits(np.asarray(token, np.int32), 0)
  np.testing.assert_allclose(got, want, atol=tol)
  poison(0, routes[0][:1])
  m.reset()
  assert np.isnan(m.step_logits(np.asarray(token, np.int32), 0)).any()
