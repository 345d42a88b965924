"""The draft model's rounds (DraftModel._pump) around a fake model whose next token is always the last plus one: runs
drafting at once share each batched step, a batch never holds one slot twice, a failed round costs only its runs'
drafts, and closing the model answers every draft still waiting. The drafts on the real model are
test_draft_model.py's."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from swactor.localcluster.cluster import DEFAULT_MODEL
from swactor.orchestrator.tokens import draft_model
from swactor.orchestrator.tokens.draft_model import DraftModel, DraftSlot

pytestmark = [pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="run `make model` (its header: the vocabulary)"),
              pytest.mark.timeout(60)]
VOCAB = 50


class NextTokenModel:
    """A stand-in for StageModel: after token t it takes t + 1. Records each batched step's slots; fails the steps
    named in `fail`; holds every step until `go` is set."""

    max_seq_len = 64

    def __init__(self, fail: set[int] | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail or set()
        self.go = threading.Event()
        self.go.set()
        self.entered = threading.Event()  # a step began

    def reset(self, slot: int) -> None:
        pass

    def rewind(self, slot: int, rows: int) -> None:
        pass

    def step(self, inputs: np.ndarray, start_pos: int, *, sample: bool, slot: int) -> None:
        pass

    def step_batch_logits(self, batch: list) -> np.ndarray:
        self.entered.set()
        self.go.wait(10)
        self.batches.append([r.slot for r in batch])
        if len(self.batches) in self.fail:
            raise RuntimeError(f"step {len(self.batches)} fails (test)")
        logits = np.zeros((len(batch), VOCAB), np.float32)
        for i, r in enumerate(batch):
            logits[i, (int(r.inputs[0]) + 1) % VOCAB] = 1.0
        return logits


def leased(fake: NextTokenModel, runs: int, slots: int = 3) -> tuple[DraftModel, list[DraftSlot]]:
    """A draft model over `fake`, and a slot for each of `runs` runs."""
    m = DraftModel(DEFAULT_MODEL, device="", slots=slots, max_seq_len=64, prefill_chunk=8, graph_cache_dir=None)
    m._model = fake  # type: ignore[assignment]
    leases = [m.lease() for _ in range(runs)]
    return m, [s for s in leases if s is not None]


@pytest.fixture(autouse=True)
def no_thinking_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(draft_model, "LOOK_AHEAD", False)  # the rounds hold only what the drafts need


def test_runs_drafting_at_once_share_each_step_one_row_each() -> None:
    fake = NextTokenModel()
    model, (a, b) = leased(fake, 2)

    async def go() -> list[tuple[int, ...]]:
        fake.go.clear()  # both are asked before the first step runs
        drafts = asyncio.gather(a.draft([1, 2, 3], 3), b.draft([10, 11], 3), a.draft([1, 2, 3, 4], 1))
        await asyncio.to_thread(fake.entered.wait, 10)
        fake.go.set()
        got = await drafts
        await model.close()
        return got

    assert asyncio.run(go()) == [(4, 5, 6), (12, 13, 14), (5,)]  # the third waits for the first: same slot
    assert all(len(set(slots)) == len(slots) for slots in fake.batches), fake.batches  # a slot once a step
    assert [0, 1] in [sorted(slots) for slots in fake.batches], fake.batches  # the two runs in one step


def test_a_failed_step_costs_only_its_runs_drafts() -> None:
    fake = NextTokenModel(fail={1})
    model, (a,) = leased(fake, 1)

    async def go() -> list[tuple[int, ...]]:
        first = await a.draft([1, 2, 3], 2)  # its first step fails: no drafts, the slot starts again
        second = await a.draft([1, 2, 3], 2)
        await model.close()
        return [first, second]

    assert asyncio.run(go()) == [(), (4, 5)]


def test_closing_answers_every_draft_still_waiting() -> None:
    fake = NextTokenModel()
    model, (a, b) = leased(fake, 2)

    async def go() -> list[tuple[int, ...]]:
        fake.go.clear()  # the first step hangs until the close has begun
        drafts = asyncio.gather(a.draft([1, 2, 3], 4), b.draft([5, 6], 4))
        await asyncio.to_thread(fake.entered.wait, 10)
        closing = asyncio.ensure_future(model.close())
        await asyncio.sleep(0)  # close() runs to its first await: the pump is told to stop
        fake.go.set()
        await closing
        return await asyncio.wait_for(drafts, 5)

    assert asyncio.run(go()) == [(), ()]  # none computed past the round the close found running
    assert len(fake.batches) == 1


def test_a_released_slot_leased_again_waits_for_its_old_draft() -> None:
    fake = NextTokenModel()
    model, (old,) = leased(fake, 1, slots=1)

    async def go() -> list[tuple[int, ...]]:
        fake.go.clear()
        first = asyncio.ensure_future(old.draft([1, 2], 3))
        await asyncio.to_thread(fake.entered.wait, 10)
        old.release()  # its run ended while the draft is computed
        new = model.lease()
        assert new is not None and new.slot == old.slot
        second = asyncio.ensure_future(new.draft([20, 21], 2))
        fake.go.set()
        got = [await first, await second]
        await model.close()
        return got

    assert asyncio.run(go()) == [(3, 4, 5), (22, 23)]
    assert all(slots == [0] for slots in fake.batches)

