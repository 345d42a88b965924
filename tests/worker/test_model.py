"""tinygrad StageModel vs the float64 numpy reference and llama.cpp's recorded greedy tokens (real weights)."""
from __future__ import annotations

import json
import pathlib
import threading

import numpy as np
import pytest
from reference import Reference

from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.header import read_header
from swactor.modelfile.memory import KV_DTYPE_BYTES, memory_profile
from swactor.worker.compute import GGUFModel, LoadProgress, ModelRefused, StageModel, graphcache
from swactor.worker.compute.graphcache import GraphCache
from swactor.worker.compute.model import KV_DTYPES, NO_TOKEN, BatchRow

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures/llamacpp_greedy.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
N_STEPS = 16
# llama.cpp tokenisation of a chat-templated "What is the capital of France?" and of the plain text "Once upon a time"
CHAT_FRANCE = next(c["prompt_tokens"] for c in CASES if c["chat_template"] and "France" in c["question"])
PROMPTS = {"chat_france": CHAT_FRANCE, "plain_france": [1780, 314, 260, 3575, 282, 4649, 47], "once": [6403, 1980, 253, 655]}
SPLITS = {1: [(0, 30)], 2: [(0, 15), (15, 30)], 3: [(0, 7), (7, 22), (22, 30)], 4: [(0, 1), (1, 10), (10, 29), (29, 30)]}


@pytest.fixture(scope="module")
def reference(model_path: str) -> dict[str, list[int]]:
  ref = Reference(model_path)
  return {k: ref.greedy(p, N_STEPS)[0] for k, p in PROMPTS.items()}


@pytest.fixture(scope="module")
def stages(gguf_model: GGUFModel) -> dict[int, list[StageModel]]:
  return {s: [StageModel(gguf_model, a, b, max_seq_len=128) for a, b in rng] for s, rng in SPLITS.items()}


def generate(chain: list[StageModel], prompt: list[int], n: int, logits: list[np.ndarray] | None = None) -> list[int]:
  """Drive the pipeline like the orchestrator: sequence 0 = prompt prefill, sequence k = one decode token."""
  for s in chain:
    s.reset()
  out, pos, x = [], 0, np.asarray(prompt, np.int32)
  for _ in range(n):
    for s in chain[:-1]:
      x = s.step(x, pos)
    if logits is not None:
      logits.append(chain[-1].step_logits(x, pos))
    tok = int(chain[-1].step(x, pos)[0]) if logits is None else int(np.argmax(logits[-1]))
    out.append(tok)
    pos += 1 if out[1:] else len(prompt)
    x = np.asarray([tok], np.int32)
  return out


@pytest.mark.parametrize("n_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_equals_float64_reference(stages: dict[int, list[StageModel]], reference: dict[str, list[int]], n_stages: int,
                                         prompt: str) -> None:
  assert generate(stages[n_stages], PROMPTS[prompt], N_STEPS) == reference[prompt]


def test_interstage_activations_are_float32_rows(stages: dict[int, list[StageModel]]) -> None:
  first, mid, last = stages[3]
  for s in stages[3]:
    s.reset()
  a = first.step(np.asarray(PROMPTS["once"], np.int32), 0)
  assert a.dtype == np.float32 and a.shape == (4, 576)
  b = mid.step(a, 0)
  assert b.dtype == np.float32 and b.shape == (4, 576)
  tok = last.step(b, 0)
  assert tok.dtype == np.int32 and tok.shape == (1,)


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{CASES[i]['question'][:20]}-chat{CASES[i]['chat_template']}")
def test_greedy_matches_llamacpp_until_near_tie(stages: dict[int, list[StageModel]], case: int) -> None:
  """Exact agreement with llama.cpp up to the first step where either side's top-2 logit gap is < 0.1 (llama.cpp
  quantizes activations to Q8_1, so its logits move by up to ~0.15 and may flip a near-tie)."""
  c, logits = CASES[case], []
  ours = generate(stages[1], c["prompt_tokens"], len(c["greedy_tokens"]), logits)
  ours_gap = [float(np.diff(np.sort(lg)[-2:])[0]) for lg in logits]
  cut = next((i for i, (g1, g2) in enumerate(zip(c["top2_gap"], ours_gap, strict=True)) if min(g1, g2) < 0.1), len(ours))
  assert ours[:cut] == c["greedy_tokens"][:cut]


def test_chunked_prefill_and_float_weights_agree(gguf_model: GGUFModel, reference: dict[str, list[int]]) -> None:
  m = StageModel(gguf_model, 0, 30, max_seq_len=128, prefill_chunk=8, quantized=False)
  assert generate([m], PROMPTS["chat_france"], N_STEPS) == reference["chat_france"]


@pytest.mark.parametrize("threads", [1, 3])
def test_quantized_chunked_prefill_any_thread_count(gguf_model: GGUFModel, reference: dict[str, list[int]], threads: int) -> None:
  """The hand-scheduled CPU block matvec with T = 8 rows, unsplit (1) and split into core_id slices run on a pool (3)."""
  m = StageModel(gguf_model, 0, 30, max_seq_len=128, prefill_chunk=8, threads=threads)
  assert generate([m], PROMPTS["chat_france"], N_STEPS) == reference["chat_france"]
  with pytest.raises(ValueError, match="threads"):
    StageModel(gguf_model, 0, 1, threads=0)


def test_planner_memory_estimate_equals_the_loaded_stages(stages: dict[int, list[StageModel]], model_path: str) -> None:
  """The orchestrator plans by modelfile.memory from the header alone: its weights and KV cache bytes are what each
  loaded stage holds (the first stage's embedding stays on the host, at the file's bytes)."""
  with open(model_path, "rb") as f:
    profile = memory_profile(read_header(lambda n: (f.seek(0), f.read(n))[1])[0])
  for n_stages, ranges in SPLITS.items():
    for (a, b), m in zip(ranges, stages[n_stages], strict=True):
      want = profile.stage(a, b, 128, rows=1)
      host = m.embd.nbytes if m.is_first else 0
      assert (want.weights - host, want.kv_cache) == (m.memory.device_bytes, m.memory.cache_bytes), (a, b)
      assert host == (profile.embedding if a == 0 else 0)


def test_planner_memory_estimate_equals_the_loaded_stages_with_a_float16_kv_cache(gguf_model: GGUFModel,
                                                                                  model_path: str) -> None:
  """The same comparison with the KV cache in float16 ([orchestrator].kv_dtype): the planner counts a run slot at
  the element size the compute core stores (KV_DTYPE_BYTES agrees with StageModel's KV_DTYPES), half of float32's.
  Two-block stages (first, middle, last) keep the loads short."""
  assert {k: np.dtype(v).itemsize for k, v in KV_DTYPES.items()} == KV_DTYPE_BYTES
  with open(model_path, "rb") as f:
    profile = memory_profile(read_header(lambda n: (f.seek(0), f.read(n))[1])[0])
  for a, b in [(0, 2), (14, 16), (28, 30)]:
    m = StageModel(gguf_model, a, b, max_seq_len=128, kv_dtype="float16")
    want = profile.stage(a, b, 128, rows=1, kv_bytes=KV_DTYPE_BYTES["float16"])
    host = m.embd.nbytes if m.is_first else 0
    assert (want.weights - host, want.kv_cache) == (m.memory.device_bytes, m.memory.cache_bytes), (a, b)
    assert want.kv_cache * 2 == profile.stage(a, b, 128, rows=1).kv_cache


def test_reset_reuses_weights_and_sampling_is_seeded(stages: dict[int, list[StageModel]]) -> None:
  m = stages[1][0]
  m.reset(SamplingPolicy(temperature=0.8, top_k=40, seed=11))
  a = generate([m], PROMPTS["once"], 8)
  m.reset(SamplingPolicy(temperature=0.8, top_k=40, seed=11))
  assert generate([m], PROMPTS["once"], 8) == a
  m.reset(SamplingPolicy())


def test_bad_inputs_are_clear_errors(stages: dict[int, list[StageModel]]) -> None:
  first, last = stages[2]
  first.reset()
  with pytest.raises(ValueError, match="token ids"):
    first.step(np.zeros((2, 576), np.float32), 0)
  with pytest.raises(ValueError, match="out of range"):
    first.step(np.asarray([49152], np.int32), 0)
  with pytest.raises(ValueError, match="start_pos"):
    first.step(np.asarray([1], np.int32), 5)
  with pytest.raises(ValueError, match="max_seq_len"):
    first.step(np.zeros(129, np.int32), 0)
  with pytest.raises(ValueError, match="activations"):
    last.step(np.zeros((1, 575), np.float32), 0)
  with pytest.raises(ValueError, match="no output head"):
    first.step_logits(np.asarray([1], np.int32), 0)


def test_load_progress_and_refusal(gguf_model: GGUFModel) -> None:
  seen: list[LoadProgress] = []
  StageModel(gguf_model, 28, 30, max_seq_len=16, on_progress=seen.append)
  assert seen[-1].layers_loaded == 2 and seen[-1].bytes_loaded == seen[-1].bytes_total
  with pytest.raises(ValueError, match="context_length"):
    StageModel(gguf_model, 0, 1, max_seq_len=10**6)
  with pytest.raises(ModelRefused, match="InvalidLayerRange"):
    StageModel(gguf_model, 3, 3)


def generate_chunked(chain: list[StageModel], prompt: list[int], n: int, chunk: int) -> list[int]:
  """Drive the pipeline like the orchestrator with prefill chunks: the prompt as objects of `chunk` tokens, each
  but the last run without the head (step(sample=False) -> NO_TOKEN), then one decode token per step."""
  for s in chain:
    s.reset()
  pos, tok = 0, None
  for c0 in range(0, len(prompt), chunk):
    x, last = np.asarray(prompt[c0:c0 + chunk], np.int32), c0 + chunk >= len(prompt)
    for s in chain[:-1]:
      x = s.step(x, pos)
    out = chain[-1].step(x, pos, sample=last)
    assert last or out.tolist() == [NO_TOKEN]
    pos += len(prompt[c0:c0 + chunk])
    tok = int(out[0])
  toks = [tok]
  for _ in range(n - 1):
    x = np.asarray([toks[-1]], np.int32)
    for s in chain[:-1]:
      x = s.step(x, pos)
    toks.append(int(chain[-1].step(x, pos)[0]))
    pos += 1
  return toks


def test_prepared_chunked_pipeline_and_graph_cache(gguf_model: GGUFModel, reference: dict[str, list[int]],
                                                   tmp_path: pathlib.Path) -> None:
  """Three stages compile their decode and 8-row prefill graphs before the first step (prepare), the prompt flows
  through them in 8-token chunks, greedy tokens equal the float64 reference; a second set of stages loads every graph
  from the disk cache (no capture) and gives the same tokens."""
  cache = GraphCache(tmp_path)
  fresh = [StageModel(gguf_model, a, b, max_seq_len=128, prefill_chunk=8, graph_cache=cache) for a, b in SPLITS[3]]
  reports = [s.prepare() for s in fresh]
  assert reports[0].cached == 0 and reports[-1].cached < reports[-1].graphs  # (stage 1 may reuse stage 0's layer graphs)
  assert generate_chunked(fresh, PROMPTS["chat_france"], N_STEPS, 8) == reference["chat_france"]
  assert list(tmp_path.glob("*.graph"))
  warm = [StageModel(gguf_model, a, b, max_seq_len=128, prefill_chunk=8, graph_cache=cache) for a, b in SPLITS[3]]
  assert all(r.cached == r.graphs for r in (s.prepare() for s in warm))
  assert generate_chunked(warm, PROMPTS["chat_france"], N_STEPS, 8) == reference["chat_france"]


def test_graph_cache_drops_a_corrupt_entry(gguf_model: GGUFModel, reference: dict[str, list[int]],
                                           tmp_path: pathlib.Path) -> None:
  cache = GraphCache(tmp_path)
  StageModel(gguf_model, 22, 30, max_seq_len=128, graph_cache=cache).prepare()
  entries = sorted(tmp_path.glob("*.graph"))
  entries[0].write_bytes(b"swgspec1 not a pickle")
  again = StageModel(gguf_model, 22, 30, max_seq_len=128, graph_cache=cache)
  report = again.prepare()
  assert report.cached < report.graphs  # the corrupt graph was captured again ...
  assert len(list(tmp_path.glob("*.graph"))) == len(entries)  # ... and stored again


def test_a_last_stage_takes_the_layer_graphs_another_stage_stored_and_captures_only_its_head(
    gguf_model: GGUFModel, reference: dict[str, list[int]], tmp_path: pathlib.Path) -> None:
  cache = GraphCache(tmp_path)
  first, mid = (StageModel(gguf_model, a, b, max_seq_len=128, prefill_chunk=8, graph_cache=cache) for a, b in SPLITS[3][:2])
  assert mid.prepare().cached == 0
  last = StageModel(gguf_model, *SPLITS[3][2], max_seq_len=128, prefill_chunk=8, graph_cache=cache)
  report = last.prepare()
  assert report.cached == report.graphs - len(last.shapes), report  # every layer graph loaded; one head per shape captured
  assert (r := first.prepare()).cached == r.graphs
  assert generate_chunked([first, mid, last], PROMPTS["chat_france"], N_STEPS, 8) == reference["chat_france"]


def test_graph_cache_claims_are_one_holder_at_a_time(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
  cache = GraphCache(tmp_path)
  held = cache.try_claim("shape")
  assert held is not None
  with held:
    assert cache.try_claim("shape") is None and cache.try_claim("other") is not None
    with cache.claim("shape", wait_s=0.2):  # still held past the wait: the waiter goes on without it
      pass
    monkeypatch.setattr(graphcache, "CLAIM_REPORT_S", 0.01)
    calls: list[int] = []

    def cancelled() -> None:  # a load's progress callback raises once the load is cancelled
      calls.append(1)
      if len(calls) == 3:
        raise RuntimeError("load cancelled")

    with pytest.raises(RuntimeError, match="load cancelled"), cache.claim("shape", wait_s=60, waiting=cancelled):
      pass
  with cache.claim("shape", wait_s=0.2), cache.claim("shape", wait_s=0.1):
    pass  # (a second claim of this process waited 0.1 s and went on: nothing deadlocks)
  broken = GraphCache(tmp_path / "file")
  (tmp_path / "file").write_text("not a directory")
  with broken.claim("shape"):  # a cache that cannot hold claims lets the worker capture
    pass


def test_a_shape_another_worker_is_capturing_is_left_for_last(gguf_model: GGUFModel, tmp_path: pathlib.Path) -> None:
  """The decode shape's claim is held elsewhere: prepare captures the 8-row prefill shape first, then waits for the
  claim; the holder gives it up having stored nothing, so this worker captures the decode graphs itself."""
  cache = GraphCache(tmp_path)
  m = StageModel(gguf_model, 22, 30, max_seq_len=128, prefill_chunk=8, graph_cache=cache)
  keys = [cache.key(m.device, name, **facts) for name, _, _, facts in m._graphs((1,))]
  held = cache.try_claim(m._claim_name((1,), keys))
  assert held is not None
  stored: list[str] = []
  store = cache.store
  cache.store = lambda key, *a: (stored.append(key), store(key, *a))[1]  # type: ignore[method-assign]
  held.__enter__()
  release = threading.Timer(1.0, held.__exit__, (None, None, None))
  release.start()
  report = m.prepare()
  release.join()
  assert report.cached == 0 and stored[-len(keys):] == keys and set(stored[:-len(keys)]).isdisjoint(keys), stored


# ---- runs in flight: KV slots and the batched decode step ----

SLOT_SPLITS = {3: SPLITS[3]}  # a first, an interior and a last stage


@pytest.fixture(scope="module")
def slotted(gguf_model: GGUFModel) -> dict[int, list[StageModel]]:
  """Stages holding 4 runs at once: batches of 1, 2 and 4 rows, a batch of 3 padded with the scratch slot."""
  return {s: [StageModel(gguf_model, a, b, max_seq_len=128, prefill_chunk=8, slots=4) for a, b in rng]
          for s, rng in SLOT_SPLITS.items()}


def in_flight(chain: list[StageModel], prompts: dict[int, list[int]], joins: dict[int, int], n: int) -> dict[int, list[int]]:
  """Drive runs in flight like a stage scheduler: each tick one prefill chunk of one joined run (the lowest slot with
  prompt left), then one batched step of every decoding run's row; a run leaves its batch once it has n tokens."""
  chunk = chain[0].chunk
  left = {s: [p[i:i + chunk] for i in range(0, len(p), chunk)] for s, p in prompts.items()}
  pos, toks = dict.fromkeys(prompts, 0), {s: [] for s in prompts}
  for s in prompts:
    for m in chain:
      m.reset(slot=s)
  tick = 0
  while any(len(t) < n for t in toks.values()):
    joined = [s for s in sorted(prompts) if joins[s] <= tick and left[s]]
    if joined:
      s, part = joined[0], left[joined[0]].pop(0)
      x: np.ndarray = np.asarray(part, np.int32)
      for m in chain:
        x = m.step(x, pos[s], slot=s, sample=not left[s])
      pos[s] += len(part)
      if not left[s]:
        toks[s].append(int(x[0]))
    decoding = [s for s in sorted(prompts) if not left[s] and 0 < len(toks[s]) < n]
    if decoding:
      xs = [np.asarray([toks[s][-1]], np.int32) for s in decoding]
      for m in chain:
        xs = m.step_batch([BatchRow(s, pos[s], x) for s, x in zip(decoding, xs, strict=True)])
      for s, x in zip(decoding, xs, strict=True):
        toks[s].append(int(x[0]))
        pos[s] += 1
    tick += 1
  return toks


def test_runs_in_flight_each_equal_the_float64_reference(slotted: dict[int, list[StageModel]],
                                                         reference: dict[str, list[int]]) -> None:
  """Four runs in four slots, prompts of 4 to 40 tokens joining at different ticks, one chunk of a joining run between
  the batched decode steps of the running ones, runs leaving as they finish (batches of 4, 3, 2, 1), through three
  stages: every run's greedy tokens are its float64 reference's. (Through the real compute process:
  tests/worker_service/test_batched_step.py.)"""
  names = {0: "chat_france", 1: "plain_france", 2: "once", 3: "plain_france"}
  joins = {0: 2, 1: 0, 2: 1, 3: 9}
  got = in_flight(slotted[3], {s: PROMPTS[k] for s, k in names.items()}, joins, N_STEPS)
  assert {s: got[s] for s in names} == {s: reference[k] for s, k in names.items()}


def test_a_slot_reused_by_a_new_run_forgets_the_old_one(slotted: dict[int, list[StageModel]],
                                                        reference: dict[str, list[int]]) -> None:
  chain = slotted[3]
  in_flight(chain, {2: PROMPTS["chat_france"]}, {2: 0}, 4)
  assert in_flight(chain, {2: PROMPTS["once"], 0: PROMPTS["plain_france"]}, {2: 0, 0: 0}, N_STEPS) == \
      {2: reference["once"], 0: reference["plain_france"]}


def test_batched_step_refusals_name_the_problem(slotted: dict[int, list[StageModel]], gguf_model: GGUFModel) -> None:
  first, mid, _ = slotted[3]
  for s in range(4):
    first.reset(slot=s)
    mid.reset(slot=s)
  one = np.asarray([1], np.int32)
  with pytest.raises(ValueError, match="at least one row"):
    first.step_batch([])
  with pytest.raises(ValueError, match=r"one row per slot, got slots \[1, 1\]"):
    first.step_batch([BatchRow(1, 0, one), BatchRow(1, 0, one)])
  with pytest.raises(ValueError, match="slot 4 is not one of this stage's 4"):
    first.step_batch([BatchRow(4, 0, one)])
  with pytest.raises(ValueError, match="slot 2 has 2"):
    first.step_batch([BatchRow(2, 0, np.asarray([1, 2], np.int32))])
  with pytest.raises(ValueError, match="start_pos 3 != expected 0 in slot 0"):
    first.step_batch([BatchRow(0, 3, one)])
  with pytest.raises(ValueError, match="activations"):
    mid.step_batch([BatchRow(0, 0, np.zeros((1, 575), np.float32))])
  with pytest.raises(ValueError, match="slot 7"):
    first.reset(slot=7)
  with pytest.raises(ValueError, match="slots must be >= 1"):
    StageModel(gguf_model, 0, 1, slots=0)


def test_float16_kv_cache_keeps_the_float64_tokens_at_half_the_bytes(gguf_model: GGUFModel,
                                                                     reference: dict[str, list[int]]) -> None:
  """KV in float16 (stored half, read back to float32): the greedy tokens still equal the float64 reference for every
  prompt (measured over 48 tokens of 8 prompts in docs/runs-in-flight.md), and a slot costs half."""
  m = StageModel(gguf_model, 0, 30, max_seq_len=128, kv_dtype="float16")  # prompts row by row: one graph to compile
  for name, prompt in PROMPTS.items():
    assert generate([m], prompt, N_STEPS) == reference[name], name
  full = StageModel(gguf_model, 29, 30, max_seq_len=128, prefill_chunk=8)
  half = StageModel(gguf_model, 29, 30, max_seq_len=128, prefill_chunk=8, kv_dtype="float16")
  assert half.memory.slot_bytes * 2 == full.memory.slot_bytes == full.memory.cache_bytes
  with pytest.raises(ValueError, match="kv_dtype must be one of"):
    StageModel(gguf_model, 29, 30, kv_dtype="int8")


# ---- speculative decoding's compute (docs/orchestrator.md "Speculative decoding") ----

SPEC_STEPS = 14
SPEC_POLICIES = {"greedy": SamplingPolicy(), "seeded": SamplingPolicy(temperature=0.9, top_k=40, seed=11)}


def spec_run(chain: list[StageModel], ids: list[int], pos: int, *, every_row: bool = False, rewind: int = 0) -> list[int]:
  """One object through the chain as the stages run it: the rewind first, then its rows at `pos`."""
  x: np.ndarray = np.asarray(ids, np.int32)
  for s in chain:
    s.rewind(0, rewind)
    x = s.step(x, pos, every_row=every_row)
  return [int(t) for t in x]


def decode(chain: list[StageModel], policy: SamplingPolicy, guess: list[int] | None = None) -> tuple[list[int], int]:
  """SPEC_STEPS tokens of PROMPTS["plain_france"], one per step, or with up to 3 drafts per step taken from `guess`
  (wrong where it is) and the rejected rows rewound; returns the tokens and the drafts accepted."""
  prompt = PROMPTS["plain_france"]
  for s in chain:
    s.reset(policy)
  out, rewind, accepted = spec_run(chain, prompt, 0), 0, 0
  try:
    while len(out) < SPEC_STEPS:
      drafts = guess[len(out):len(out) + min(3, SPEC_STEPS - len(out) - 1)] if guess else []
      sampled = spec_run(chain, [out[-1], *drafts], len(prompt) + len(out) - 1, every_row=bool(drafts), rewind=rewind)
      assert len(sampled) == len(drafts) + 1
      a = 0
      while a < len(drafts) and sampled[a] == drafts[a]:
        a += 1
      out += sampled[:a + 1]
      accepted += a
      rewind = len(drafts) - a
  finally:
    for s in chain:
      s.reset(SamplingPolicy())  # the module's stages are greedy for the other tests
  return out[:SPEC_STEPS], accepted


@pytest.mark.parametrize("policy", list(SPEC_POLICIES))
def test_drafts_verified_and_rewound_give_the_plain_tokens(stages: dict[int, list[StageModel]], policy: str) -> None:
  chain, p = stages[2], SPEC_POLICIES[policy]
  want, _ = decode(chain, p)
  right, accepted = decode(chain, p, want)
  assert right == want and accepted > SPEC_STEPS // 2  # every draft right: most steps take several tokens
  wrong = [t if i % 3 else (t + 1) % 1000 for i, t in enumerate(want)]  # every third draft wrong: rewinds
  got, accepted = decode(chain, p, wrong)
  assert got == want and 0 < accepted < SPEC_STEPS


def test_verified_rows_compute_exactly_their_decode_steps(stages: dict[int, list[StageModel]]) -> None:
  first, last = stages[2]
  prompt, outs = PROMPTS["plain_france"], []
  for every_row in (False, True):
    for s in stages[2]:
      s.reset()
    tok = last.step(first.step(np.asarray(prompt, np.int32), 0), 0)
    ids, pos = np.asarray([int(tok[0]), 42, 7], np.int32), len(prompt)
    if every_row:
      acts = first.step(ids, pos, every_row=True)
      toks = last.step(acts, pos, every_row=True)
    else:
      acts = np.concatenate([first.step(ids[i:i + 1], pos + i) for i in range(3)])
      toks = np.concatenate([last.step(acts[i:i + 1], pos + i) for i in range(3)])
    outs.append((acts, toks))
  (a0, t0), (a1, t1) = outs
  assert np.array_equal(a0, a1) and np.array_equal(t0, t1)  # bit for bit: the same kernels at the same positions


def test_a_rewind_past_the_run_is_refused(stages: dict[int, list[StageModel]]) -> None:
  first = stages[2][0]
  first.reset()
  first.step(np.asarray(PROMPTS["once"], np.int32), 0)
  with pytest.raises(ValueError, match="cannot rewind 5 rows in slot 0: it holds 4 positions"):
    first.rewind(0, 5)


def test_a_decode_step_says_its_blocks_time_a_prompt_does_not(stages: dict[int, list[StageModel]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
  """last_layers_s (the host's speed: worker/step_speed.py): set by a one-row step, on the CPU's launcher and on
  TinyJit's replay (a GPU's path), where a mark after the first block leaves what the step pays once out; None after a
  prompt's rows. The tokens do not depend on the path or the marks."""
  first, last = stages[2]
  prompt = PROMPTS["once"]
  marks_seen: list[list[float]] = []
  blocks_seconds = StageModel._blocks_seconds

  def spy(self: StageModel, t0: float, marks: list[float], t1: float) -> float:
    marks_seen.append(list(marks))
    return blocks_seconds(self, t0, marks, t1)

  monkeypatch.setattr(StageModel, "_blocks_seconds", spy)
  toks = []
  for replay in ("launcher", "tinygrad"):
    for s in (first, last):
      s.reset()
    saved = first._plans.get((1,))
    if replay == "tinygrad":
      first._plans[(1,)] = None  # no launcher plan: each block's graph replayed by TinyJit, as on a GPU
    try:
      tok = last.step(first.step(np.asarray(prompt, np.int32), 0), 0)
      assert first.last_layers_s is None and last.last_layers_s is None  # a prompt's rows: no decode step's time
      marks_seen.clear()
      tok = last.step(first.step(tok, len(prompt)), len(prompt))
      assert first.last_layers_s is not None and first.last_layers_s > 0 and last.last_layers_s is not None
      assert [len(m) for m in marks_seen] == ([0, 0] if replay == "launcher" else [1, 0])  # 15 blocks: marked
      toks.append(int(tok[0]))
    finally:
      first._plans[(1,)] = saved
  assert toks[0] == toks[1]


def test_blocks_seconds_leaves_the_first_block_out_when_marked() -> None:
  class Stub:
    layers = [object()] * 5

  assert StageModel._blocks_seconds(Stub(), 0.0, [1.0], 3.0) == 2.5  # (3 - 1) / 4 blocks x 5
  assert StageModel._blocks_seconds(Stub(), 0.0, [], 3.0) == 3.0
