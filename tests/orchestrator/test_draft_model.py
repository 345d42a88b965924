"""The orchestrator's draft model (tokens/draft_model.py) on the default GGUF: its drafts are the model's greedy tokens,
also after rejected drafts, in a slot another run used, and it refuses a model of another vocabulary by name."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from swactor.common.sampling import SamplingPolicy
from swactor.localcluster.cluster import DEFAULT_MODEL
from swactor.orchestrator.tokens.draft_model import DraftModel, DraftModelError
from swactor.orchestrator.tokens.tokenizer import Tokenizer
from swactor.worker.compute.sampling import Sampler

pytestmark = [pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="run `make model` (default GGUF missing)"),
              pytest.mark.timeout(300)]
REFERENCE_SLOT = 0
PROMPT = [1, 504, 2365, 3543, 335, 260, 1947, 30, 378, 2365, 3543, 335, 260]  # ids of the default model


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def draft(loop: asyncio.AbstractEventLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraftModel]:
    model = DraftModel(DEFAULT_MODEL, device="", slots=3, max_seq_len=48, prefill_chunk=8,
                       graph_cache_dir=tmp_path_factory.mktemp("draft-graphs"))
    loop.run_until_complete(model.load())
    reference = model.lease()  # slot 0: the reference's (greedy), never drafting
    assert reference is not None and reference.slot == REFERENCE_SLOT
    yield model
    loop.run_until_complete(model.close())


def greedy(draft: DraftModel, context: list[int], n: int) -> list[int]:
    """The model's own greedy continuation, one full step at a time in a fresh slot (the reference), on the model's
    thread (a slot may be thinking ahead there)."""
    return draft._executor.submit(_greedy, draft, context, n).result()


def _greedy(draft: DraftModel, context: list[int], n: int) -> list[int]:
    m = draft._model
    assert m is not None
    m.reset(slot=REFERENCE_SLOT)
    logits = m.step_logits(np.asarray(context, np.int32), 0, slot=REFERENCE_SLOT)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = m.step_logits(np.asarray(out[-1:], np.int32), len(context) + len(out) - 1, slot=REFERENCE_SLOT)
    return out


def test_drafts_are_the_greedy_tokens_also_after_rejected_drafts(loop: asyncio.AbstractEventLoop,
                                                                  draft: DraftModel) -> None:
    want = greedy(draft, PROMPT, 10)
    slot = draft.lease()
    assert slot is not None
    try:
        loop.run_until_complete(slot.warm(PROMPT))
        assert loop.run_until_complete(slot.draft(PROMPT, 4)) == tuple(want[:4])
        # the pipeline kept 2 drafts and sampled another token: the slot forgets the rest of its drafts
        other = (want[2] + 1) % 1000
        after = PROMPT + want[:2] + [other]
        assert loop.run_until_complete(slot.draft(after, 3)) == tuple(greedy(draft, after, 3))
        # back on the greedy path, past what the slot held
        assert loop.run_until_complete(slot.draft(PROMPT + want[:5], 5)) == tuple(want[5:10])
        # a draft that would pass the draft model's context (48 positions) is none; one that fills it is made
        assert loop.run_until_complete(slot.draft(PROMPT * 3, 11)) == ()
        assert len(loop.run_until_complete(slot.draft(PROMPT * 3, 10))) == 10
    finally:
        slot.release()


def sampled(draft: DraftModel, context: list[int], n: int, policy: SamplingPolicy, first_draw: int) -> list[int]:
    """What the last stage of a run sampling by `policy` takes after `context`, its answer's token `first_draw` on."""

    def run() -> list[int]:
        m = draft._model
        assert m is not None
        sampler = Sampler(policy)
        sampler.rng.bit_generator.advance(first_draw)
        m.reset(slot=REFERENCE_SLOT)
        logits = m.step_logits(np.asarray(context, np.int32), 0, slot=REFERENCE_SLOT)
        out = []
        for _ in range(n):
            out.append(sampler(logits))
            logits = m.step_logits(np.asarray(out[-1:], np.int32), len(context) + len(out) - 1, slot=REFERENCE_SLOT)
        return out

    return draft._executor.submit(run).result()


def test_a_sampled_run_s_drafts_are_its_own_draws(loop: asyncio.AbstractEventLoop, draft: DraftModel) -> None:
    """Seeded sampling: each draft is the token the run samples there (the model drafting for itself agrees on every
    one), also after a rejected draft and for a resumed answer's later draws."""
    for policy in (SamplingPolicy(temperature=1.2, top_k=40, seed=7), SamplingPolicy(temperature=0.9, top_p=0.9,
                                                                                     seed=3, skip_draws=5)):
        want = sampled(draft, PROMPT, 8, policy, 0)
        assert want != greedy(draft, PROMPT, 8)  # these draws leave the greedy path
        slot = draft.lease(policy, len(PROMPT))
        assert slot is not None
        try:
            assert loop.run_until_complete(slot.draft(PROMPT, 4)) == tuple(want[:4])
            other = (want[2] + 1) % 1000
            after = PROMPT + want[:2] + [other]  # the run's third token is not the chain's: draws 3.. follow it
            assert loop.run_until_complete(slot.draft(after, 3)) == tuple(sampled(draft, after, 3, policy, 3))
        finally:
            slot.release()


def test_between_steps_the_slot_thinks_ahead_along_its_chain(loop: asyncio.AbstractEventLoop, draft: DraftModel) -> None:
    slot = draft.lease()
    assert slot is not None
    try:
        drafts = loop.run_until_complete(slot.draft(PROMPT, 3))
        until = len(PROMPT) + 2 * 3 + 3
        deadline = time.monotonic() + 60
        while len(slot._held) < until and time.monotonic() < deadline:  # one job per token on the model's thread
            draft._executor.submit(lambda: None).result()
        assert len(slot._held) == until
        want = greedy(draft, PROMPT, 9)
        assert slot._held[len(PROMPT):] == want[:until - len(PROMPT)] and drafts == tuple(want[:3])
        # every draft accepted, the pipeline's token the chain's: the next drafts are read off what it thought
        assert loop.run_until_complete(slot.draft(PROMPT + want[:4], 4)) == tuple(want[4:8])
    finally:
        slot.release()


def test_a_slot_leased_again_starts_from_nothing(loop: asyncio.AbstractEventLoop, draft: DraftModel) -> None:
    first = draft.lease()
    assert first is not None
    loop.run_until_complete(first.draft([*PROMPT[:5], 42, 43], 2))
    first.release()
    assert loop.run_until_complete(first.draft(PROMPT, 2)) == ()  # released: no more drafts
    leases = [draft.lease(), draft.lease()]
    assert None not in leases and draft.lease() is None  # two slots besides the reference's
    for s in leases:
        assert loop.run_until_complete(s.draft(PROMPT, 3)) == tuple(greedy(draft, PROMPT, 3))  # type: ignore[union-attr]
        s.release()  # type: ignore[union-attr]


def test_the_vocabulary_must_be_the_run_model_s(draft: DraftModel) -> None:
    tokenizer = Tokenizer.from_gguf(DEFAULT_MODEL)
    assert draft.refuses(tokenizer, "smol") == ""
    other = Tokenizer(dataclasses.replace(tokenizer.data, tokens=[*tokenizer.tokens[:7], "<changed>",
                                                                 *tokenizer.tokens[8:]]))
    assert draft.refuses(other, "smol") == (
        f"the draft model {DEFAULT_MODEL.name} has another vocabulary than model 'smol' "
        f"({len(tokenizer.tokens)} tokens against {len(tokenizer.tokens)}; they differ from id 7)")


def test_a_file_that_is_no_gguf_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "draft.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(DraftModelError, match=r"draft model: .*draft\.gguf: not a readable GGUF file"):
        DraftModel(bad, device="", slots=1, max_seq_len=16, prefill_chunk=8, graph_cache_dir=None)
    with pytest.raises(DraftModelError, match=r"draft model: .*missing\.gguf does not exist"):
        DraftModel(tmp_path / "missing.gguf", device="", slots=1, max_seq_len=16, prefill_chunk=8, graph_cache_dir=None)


def test_runs_drafting_at_once_share_the_model_s_steps(loop: asyncio.AbstractEventLoop, draft: DraftModel) -> None:
    """Two runs' drafts are computed in the same rounds, one batched step a round for both, each its own greedy
    tokens; so is their thinking ahead."""
    leases = [draft.lease(), draft.lease()]
    assert None not in leases
    other = [1, 504, 2365, 28, 3543, 30]
    rounds, rows = draft.rounds, draft.rows

    async def both() -> list[tuple[int, ...]]:
        return await asyncio.gather(*(s.draft(c, 4) for s, c in zip(leases, (PROMPT, other), strict=True)))  # type: ignore[union-attr]

    try:
        got = loop.run_until_complete(both())
        assert got == [tuple(greedy(draft, PROMPT, 4)), tuple(greedy(draft, other, 4))]
        assert draft.rows - rows > draft.rounds - rounds > 0, (draft.rounds - rounds, draft.rows - rows)
    finally:
        for s in leases:
            s.release()  # type: ignore[union-attr]
