"""Speculative decoding in the run FSM (docs/orchestrator.md "Speculative decoding"): drafts sent, the confirmed prefix
delivered, rejected rows rewound in the next object, drafts bounded by the run's end, bad token-out objects refused."""

from __future__ import annotations

import pytest

from swactor.common.objflags import VERIFY, with_rewind
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb

from .test_fsm import kinds, make, of, teardown, to_ready

PROMPT = (5, 6, 7, 8, 5, 6)


def speculating(max_tokens: int = 10, speculate: int = 3, draft_model: bool = False) -> F.RunFsm:
    fsm = make(stages=1, max_tokens=max_tokens, prompt=PROMPT, speculate=speculate, draft_model=draft_model)
    to_ready(fsm, (1,))
    return fsm


def test_confirmed_drafts_are_delivered_and_the_rejected_rows_rewound() -> None:
    fsm = speculating()
    acts = fsm.handle(F.TokenReceived(0, 7), 3.0)  # ... 5 6 7: the prompt's 5 6 7 was followed by 8 5 (2 drafts first)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(1, (7, 8, 5), VERIFY)]
    acts = fsm.handle(F.DraftsVerified(1, (8, 9, 4)), 3.1)  # 8 confirmed, 9 sampled where 5 was drafted
    assert of(acts, F.Deliver) == [F.Deliver(1, 8, False), F.Deliver(2, 9, False)]
    assert of(acts, F.InjectTokens) == [F.InjectTokens(2, (9,), with_rewind(0, 1))]  # 8 9 never seen: no draft
    received = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == pb.TOKEN_RECEIVED]
    assert [(e.sequence, dict(e.counters)) for e in received] == [
        (1, {"token_id": 8, "drafted": 2, "accepted": 1}), (1, {"token_id": 9})]
    acts = fsm.handle(F.TokenReceived(2, 4), 3.2)
    assert of(acts, F.Deliver) == [F.Deliver(3, 4, False)] and of(acts, F.InjectTokens) == [F.InjectTokens(3, (4,))]
    assert fsm.tokens == [7, 8, 9, 4] and (fsm.drafted, fsm.accepted) == (2, 1)


def test_every_draft_rejected_rewinds_them_all_and_the_run_ends_with_its_counts() -> None:
    fsm = speculating(max_tokens=3)
    acts = fsm.handle(F.TokenReceived(0, 7), 3.0)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(1, (7, 8), VERIFY)]  # two tokens left: one draft is enough
    acts = fsm.handle(F.DraftsVerified(1, (1, 2)), 3.1)
    assert of(acts, F.Deliver) == [F.Deliver(1, 1, False)]
    assert of(acts, F.InjectTokens) == [F.InjectTokens(2, (1,), with_rewind(0, 1))]
    acts = fsm.handle(F.TokenReceived(2, 3), 3.2)
    done = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == pb.RUN_COMPLETED]
    assert fsm.reason == "max_tokens" and dict(done[0].counters) == {"tokens": 3, "drafted": 1, "accepted": 0}
    assert kinds(teardown(fsm))[-1] == "RUN_TORN_DOWN"


def test_drafts_past_max_tokens_are_not_delivered() -> None:
    fsm = speculating(max_tokens=3, speculate=3)
    fsm.handle(F.TokenReceived(0, 7), 3.0)
    acts = fsm.handle(F.DraftsVerified(1, (8, 5)), 3.1)  # the draft 8 confirmed, then 5: the run's 3 tokens
    assert of(acts, F.Deliver) == [F.Deliver(1, 8, False), F.Deliver(2, 5, False)]
    assert of(acts, F.InjectTokens) == [] and fsm.reason == "max_tokens"


@pytest.mark.parametrize("bad", [F.TokenReceived(1, 8), F.DraftsVerified(1, (8, 5)), F.DraftsVerified(1, (8, 5, 6, 7))])
def test_a_token_object_not_holding_one_token_per_row_faults(bad: F.Input) -> None:
    fsm = speculating()
    fsm.handle(F.TokenReceived(0, 7), 3.0)  # drafts 8 5: three rows, three tokens due
    acts = fsm.handle(bad, 3.1)
    assert fsm.reason == "RUN_FAULT_OBJECT_FAILED" and "RUN_FAULTED" in kinds(acts)
    assert "had 2 draft(s), so 3 were due" in fsm.detail


def test_without_speculate_no_draft_is_made() -> None:
    fsm = make(stages=1, max_tokens=10, prompt=PROMPT)
    to_ready(fsm, (1,))
    assert of(fsm.handle(F.TokenReceived(0, 7), 3.0), F.InjectTokens) == [F.InjectTokens(1, (7,))]


def test_the_draft_model_s_answer_completes_the_object_that_waited_for_it() -> None:
    fsm = speculating(draft_model=True)
    acts = fsm.handle(F.TokenReceived(0, 7), 3.0)
    assert of(acts, F.DraftWanted) == [F.DraftWanted(1, 2)] and of(acts, F.InjectTokens) == []  # 2 drafts at first
    assert of(fsm.handle(F.Drafted(1, (8, 5)), 3.05), F.InjectTokens) == [F.InjectTokens(1, (7, 8, 5), VERIFY)]
    acts = fsm.handle(F.DraftsVerified(1, (8, 9, 4)), 3.1)  # 8 confirmed, 9 sampled where 5 was drafted
    assert of(acts, F.Deliver) == [F.Deliver(1, 8, False), F.Deliver(2, 9, False)]
    assert of(acts, F.DraftWanted) == [F.DraftWanted(2, 1)]  # some rejected: one draft fewer
    assert of(fsm.handle(F.Drafted(2, (4,)), 3.15), F.InjectTokens) == [F.InjectTokens(2, (9, 4), with_rewind(VERIFY, 1))]
    assert (fsm.drafted, fsm.accepted) == (2, 1)


def test_no_draft_from_the_draft_model_sends_the_plain_object_and_a_stale_answer_is_dropped() -> None:
    fsm = speculating(draft_model=True)
    fsm.handle(F.TokenReceived(0, 7), 3.0)
    assert of(fsm.handle(F.Drafted(5, (8, 5)), 3.01), F.InjectTokens) == []  # not the object that waits
    assert of(fsm.handle(F.Drafted(1, ()), 3.02), F.InjectTokens) == [F.InjectTokens(1, (7,))]
    assert of(fsm.handle(F.Drafted(1, (8,)), 3.03), F.InjectTokens) == []  # answered already


def test_draft_model_tokens_outside_the_vocabulary_or_past_the_run_s_end_are_not_sent() -> None:
    fsm = speculating(max_tokens=3, draft_model=True)
    fsm.handle(F.TokenReceived(0, 7), 3.0)
    assert of(fsm.handle(F.Drafted(1, (8, 5, 6)), 3.01), F.InjectTokens) == [F.InjectTokens(1, (7, 8), VERIFY)]
    fsm = speculating(draft_model=True)
    fsm.handle(F.TokenReceived(0, 7), 3.0)
    vocab = fsm.request.model.vocab_size
    assert of(fsm.handle(F.Drafted(1, (8, vocab)), 3.01), F.InjectTokens) == [F.InjectTokens(1, (7,))]


def test_a_run_waiting_for_its_draft_still_times_out() -> None:
    fsm = speculating(draft_model=True)
    fsm.handle(F.TokenReceived(0, 7), 3.0)
    acts = fsm.handle(F.Tick(), 3.0 + fsm.timeouts.step_s + 0.1)
    assert fsm.reason == "RUN_FAULT_STEP_TIMEOUT" and "RUN_FAULTED" in kinds(acts)
