"""Submit one run to the orchestrator and follow it to its end, timing what the client sees.

TTFT is measured from SubmitRun to the first TokenDelta (client clock); decode tok/s over the
tokens after the first. Lifecycle events keep the services' own wall-clock stamps (time_us)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc


@dataclass
class RunResult:
    run_id: int = 0
    prompt_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    events: list[pb.LifecycleEvent] = field(default_factory=list)
    finished: opb.Run | None = None
    submitted_s: float = 0.0  # time.monotonic() at SubmitRun
    token_s: list[float] = field(default_factory=list)  # monotonic receive time per token
    ended_s: float = 0.0

    @property
    def outcome(self) -> str:
        if self.finished is None:
            return "unknown"
        return opb.RunOutcome.Name(self.finished.outcome).removeprefix("RUN_OUTCOME_").lower()

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.submitted_s if self.token_s else None

    @property
    def decode_tok_s(self) -> float | None:
        if len(self.token_s) < 2:
            return None
        span = self.token_s[-1] - self.token_s[0]
        return (len(self.token_s) - 1) / span if span > 0 else None

    def event_times(self, kind: int) -> list[int]:
        return [e.time_us for e in self.events if e.kind == kind]

    def summary(self) -> dict[str, object]:
        f = self.finished
        ready = self.event_times(pb.READINESS_BARRIER_PASSED)
        first = self.event_times(pb.TOKEN_RECEIVED)
        return {
            "run_id": self.run_id, "outcome": self.outcome, "reason": f.reason if f else "",
            "detail": f.detail if f else "", "prompt_tokens": self.prompt_tokens, "tokens": len(self.token_ids),
            "ttft_s": self.ttft_s, "decode_tok_s": self.decode_tok_s,
            # server side: readiness barrier -> first token (prefill through every stage)
            "prefill_s": (first[0] - ready[0]) / 1e6 if ready and first else None,
            "provision_s": (ready[0] - f.created_us) / 1e6 if ready and f else None,
            "teardown_s": (f.torn_down_us - f.outcome_us) / 1e6 if f and f.torn_down_us else None,
            "wall_s": self.ended_s - self.submitted_s,
        }


def follow(stub: orchestrator_pb2_grpc.OrchestratorStub, req: opb.SubmitRunRequest,
           on_update: Callable[[opb.RunUpdate, RunResult], None] = lambda u, r: None,
           on_submitted: Callable[[RunResult], None] = lambda r: None, timeout_s: float = 600.0) -> RunResult:
    """SubmitRun, then WatchRun until the finished Run (or `timeout_s`, then DEADLINE_EXCEEDED)."""
    res = RunResult(submitted_s=time.monotonic())
    resp = stub.SubmitRun(req, timeout=30)
    res.run_id, res.prompt_tokens = resp.run_id, resp.prompt_tokens
    on_submitted(res)
    for u in stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id), timeout=timeout_s):
        if u.HasField("token"):
            res.token_s.append(time.monotonic())
            res.token_ids.append(u.token.token_id)
            res.text += u.token.text
        elif u.HasField("event"):
            res.events.append(u.event)
        elif u.HasField("finished"):
            res.finished = u.finished
        on_update(u, res)
    res.ended_s = time.monotonic()
    return res
