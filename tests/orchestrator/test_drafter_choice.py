"""Which drafter a speculative run gets (SubmitRunRequest.drafter, docs/orchestrator.md "Speculative decoding"): the
draft model when it fits the model and has a slot free, prompt lookup otherwise; naming a draft model that cannot
serve is refused by name. The draft model is a fake here (test_draft_model.py runs the real one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving
from .helpers import pool

pytestmark = pytest.mark.timeout(60)


class FakeSlot:
    def __init__(self, owner: FakeDraftModel) -> None:
        self.owner = owner

    async def warm(self, context) -> None:
        pass

    async def draft(self, context, k: int) -> tuple[int, ...]:
        return ()

    def release(self) -> None:
        self.owner.free += 1


class FakeDraftModel:
    def __init__(self, fits: bool = True, slots: int = 1) -> None:
        self.fits, self.free, self.leased = fits, slots, 0

    def refuses(self, tokenizer, model_name: str) -> str:
        return "" if self.fits else f"another vocabulary than model {model_name!r}"

    def lease(self, sampling=None, prompt_tokens: int = 0) -> FakeSlot | None:
        if not self.free:
            return None
        self.free -= 1
        self.leased += 1
        return FakeSlot(self)


def drafts_with_model(tmp: Path, draft: FakeDraftModel, *requests: opb.SubmitRunRequest) -> list[bool | str]:
    """Each request submitted in turn, once the run before it is gone: whether its run drafts with the model (it took
    a slot when it started), or the refusal's details."""

    async def main() -> list[bool | str]:
        async with serving(tmp, FakeFleet([2]), pool(1), draft_model=draft) as s:  # type: ignore[arg-type]
            out: list[bool | str] = []
            for req in requests:
                leased = draft.leased
                try:
                    run_id = (await s.stub.SubmitRun(req)).run_id
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                    out.append(e.details())
                    continue
                assert not s.orch.queued()  # started at once: its drafter chosen
                out.append(draft.leased > leased)
                await s.stub.StopRun(opb.StopRunRequest(run_id=run_id))  # the fake pool may have completed it
                while run_id in s.orch.live_run_ids():
                    await asyncio.sleep(0.01)
            return out

    return asyncio.run(asyncio.wait_for(main(), 30))


def submit(speculate: int, drafter: int = opb.DRAFTER_AUTO) -> opb.SubmitRunRequest:
    return opb.SubmitRunRequest(prompt="hi", max_tokens=4, speculate=speculate, drafter=drafter)


def test_auto_takes_the_draft_model_that_fits_and_prompt_lookup_is_kept_when_named(tmp_path: Path) -> None:
    draft = FakeDraftModel()
    assert drafts_with_model(tmp_path, draft, submit(3), submit(3, opb.DRAFTER_DRAFT_MODEL), submit(3, opb.DRAFTER_PROMPT_LOOKUP),
                             submit(0, opb.DRAFTER_DRAFT_MODEL)) == [True, True, False, False]
    assert draft.free == 1  # every slot given back when its run ended


def test_with_every_slot_drafting_a_run_drafts_by_prompt_lookup(tmp_path: Path) -> None:
    draft = FakeDraftModel(slots=1)
    held = draft.lease()
    assert drafts_with_model(tmp_path, draft, submit(3), submit(3, opb.DRAFTER_DRAFT_MODEL)) == [False, False]
    assert held is not None and draft.free == 0


def test_a_draft_model_of_another_vocabulary_is_not_used_and_refused_when_named(tmp_path: Path) -> None:
    draft = FakeDraftModel(fits=False)
    name = "smollm2-135m-instruct"
    assert drafts_with_model(tmp_path, draft, submit(3), submit(3, opb.DRAFTER_DRAFT_MODEL)) == [
        False, f"drafter DRAFTER_DRAFT_MODEL: another vocabulary than model {name!r}"]
