"""What the run FSM (fsm.py) takes and gives: the run's request and configuration, its inputs and its actions.

Plain frozen values, so the FSM stays I/O-free and a test can build any input or compare any action.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from swactor.common.msgbase import Failure
from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.memory import DEFAULT_KV_DTYPE
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.models.gguf_model import ModelFacts
from swactor.orchestrator.planning.placement import DEFAULT_MAX_SLOTS_PER_STAGE
from swactor.orchestrator.planning.planner import RunPlan, Seat, StagePlan
from swactor.v1 import common_pb2 as pb

# The margin a run's step and first-token timeouts get over its token ring's measured round trip (Timeouts.for_ring):
# a ring's RTT wanders with load and loss (a lost packet is sent again after about one more RTT), so a few rings more
# than the configured value, which is meant for the compute, keeps a far ring from timing out a healthy run.
STEP_RING_TRIPS = 4
FIRST_TOKEN_RING_TRIPS = 4  # per prompt chunk


@dataclass(frozen=True)
class Timeouts:
    pool_s: float = 60.0
    # a stage not ready that reports no progress this long faults the run; a weights fetch that reports its rate is
    # given FETCH_MARGIN times what that rate says it needs, while it moves at readiness_min_fetch_bps or more
    # (readiness.py)
    readiness_s: float = 600.0
    readiness_min_fetch_bps: int = 1 << 20
    first_token_s: float = 300.0  # prefill through every stage
    step_s: float = 60.0  # one decode step through every stage
    teardown_s: float = 30.0

    def for_ring(self, ring_ms: float, prompt_chunks: int = 1) -> Timeouts:
        """These timeouts for a run whose token ring has this round trip (RunPlan.ring_rtt_ms): a step is given
        STEP_RING_TRIPS rings more than step_s, the first token FIRST_TOKEN_RING_TRIPS rings more per prompt chunk
        than first_token_s (each chunk counted as a whole ring, as if they did not pipeline). The configured values
        are what a step may take on top of the network; a ring of 0 (nothing measured) leaves them unchanged."""
        ring_s = max(0.0, ring_ms) / 1000
        return dataclasses.replace(
            self, step_s=self.step_s + STEP_RING_TRIPS * ring_s,
            first_token_s=self.first_token_s + FIRST_TOKEN_RING_TRIPS * ring_s * max(1, prompt_chunks))


@dataclass(frozen=True)
class RunRequest:
    run_id: int
    model: ModelFacts
    prompt_ids: tuple[int, ...]
    stages: int
    max_tokens: int
    sampling: SamplingPolicy
    eog_ids: frozenset[int]
    node_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # an end-of-generation token does not end the run
    trace_objects: bool = False  # stages report per-object events (diagnostics)
    # The seats of the runs in flight this run joins (RunPlan.seats; node_ids pins their nodes): its plan must sit
    # exactly there, or its stages would not share their resident weights. () = a run placed on its own.
    joins: tuple[Seat, ...] = ()
    # Prompt and generated tokens at most (SubmitRunRequest.max_context): the run completes "context_full" there.
    # 0 = the plan's max_seq_len (the model's context as capped), which also sizes the stages' KV slots.
    max_context: int = 0
    stop_when_unwatched: bool = False  # SubmitRunRequest.stop_when_unwatched: its client gone, the run is stopped
    resume: bool = False  # SubmitRunRequest.resume: a shared part's fault continues the request as a new run
    resumes: int = 0  # the runs of its request before this one (a continuation's count; manager.MAX_RESUMES)
    speculate: int = 0  # SubmitRunRequest.speculate: drafted tokens per step at most (0: no speculative decoding)
    # The drafts come from the orchestrator's draft model (DraftWanted, answered by Drafted), not from prompt lookup.
    draft_model: bool = False


@dataclass(frozen=True)
class FsmConfig:
    orchestrator_node_id: int
    timeouts: Timeouts = field(default_factory=Timeouts)
    pool_window_s: float = 2.0
    max_seq_len_cap: int = 4096
    ring_ceiling_bytes: int = 4 << 20
    prefill_chunk: int = 0  # prompt tokens per chunk object (docs/orchestrator.md "Prefill chunks"); 0: one object
    max_slots_per_stage: int = DEFAULT_MAX_SLOTS_PER_STAGE  # the most run slots placement gives a stage
    kv_dtype: str = DEFAULT_KV_DTYPE  # the stages' KV cache dtype: placement counts a run slot in it, stages keep it
    split_by_speed: bool = True  # blocks may follow the hosts' measured speed (placement.SPEED_GAIN)


# ---- inputs ----


@dataclass(frozen=True)
class _Stage:
    """What a stage's node reports lists the stage's index first (a failure then its RunFaultReason
    and detail: swactor.common.msgbase)."""

    stage_index: int


@dataclass(frozen=True)
class MembershipChanged:
    members: tuple[NodeInfo, ...]


@dataclass(frozen=True)
class ProvisionFailed(Failure, _Stage):
    """The ProvisionStage call itself failed (rejected or the node was unreachable)."""


@dataclass(frozen=True)
class StageReady(_Stage):
    """The stage's node reports it ready (StageUpdate.ready)."""


@dataclass(frozen=True)
class StageFault(_Stage):
    reason: int  # RunFaultReason
    component: int  # Component
    detail: str = ""
    cause: str = ""  # the §37 cause's name (StageFault.cause), also at the start of `detail`


@dataclass(frozen=True)
class StageStopped(_Stage):
    """The stage's node reports it stopped (StageUpdate.stopped)."""


@dataclass(frozen=True)
class EndpointsReady:
    """The local token-in producer and token-out consumer are established."""


@dataclass(frozen=True)
class EndpointsClosed:
    """The local token endpoints are torn down (their edges stopped, rings released); `left` names
    what could not be confirmed ("" = everything)."""

    left: str = ""


@dataclass(frozen=True)
class EndpointFault(Failure):
    """A local token endpoint failed: a RunFaultReason."""


@dataclass(frozen=True)
class TokenReceived:
    sequence: int
    token_id: int


@dataclass(frozen=True)
class DraftsVerified:
    """Token-out delivered a VERIFY object's tokens (objflags): the token sampled after each of its rows."""

    sequence: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Drafted:
    """The draft model's answer to DraftWanted: up to that many tokens to follow the run's tokens so far (may be
    none: a draft that failed or found no room is no draft, never a fault)."""

    sequence: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class PromptChunkDone:
    """Token-out delivered the object of a prompt chunk before the last (flagged PROMPT_CONTINUES): no token."""

    sequence: int


@dataclass(frozen=True)
class OperatorStop:
    detail: str = ""


@dataclass(frozen=True)
class OrchestratorFault(Failure):
    """The orchestrator cannot carry the run on (its run store cannot be written): a RunFaultReason;
    fault and tear down."""


@dataclass(frozen=True)
class Relay:
    """A lifecycle event a node emitted for this run (weights_loaded, edge_ready, ...): recorded as is."""

    event: pb.LifecycleEvent


@dataclass(frozen=True)
class RelayBatch:
    """Several node events at once (a traced run's per-object events of one sequence): recorded as they are."""

    events: tuple[pb.LifecycleEvent, ...]


@dataclass(frozen=True)
class Tick:
    pass


Input = (
    MembershipChanged | ProvisionFailed | StageReady | StageFault | StageStopped | EndpointsReady
    | EndpointsClosed | EndpointFault | TokenReceived | DraftsVerified | Drafted | PromptChunkDone | OperatorStop | OrchestratorFault | Relay
    | RelayBatch | Tick
)

# ---- actions ----


@dataclass(frozen=True)
class OpenEndpoints:
    plan: RunPlan


@dataclass(frozen=True)
class Provision:
    plan: RunPlan
    stage: StagePlan


@dataclass(frozen=True)
class InjectTokens:
    sequence: int
    token_ids: tuple[int, ...]
    flags: int = 0  # the object header's flags (PROMPT_CONTINUES on a prompt chunk before the last)


@dataclass(frozen=True)
class DraftWanted:
    """Ask the run's draft model for up to `up_to` tokens to follow the prompt and the tokens delivered so far; the
    answer (Drafted) completes the token-in object `sequence`."""

    sequence: int
    up_to: int


@dataclass(frozen=True)
class StopStage:
    stage: StagePlan


@dataclass(frozen=True)
class CloseEndpoints:
    pass


@dataclass(frozen=True)
class Emit:
    event: pb.LifecycleEvent


@dataclass(frozen=True)
class Deliver:
    """A generated token, in order, for the output stream."""

    sequence: int  # the token's index in the answer (0 = first); its object's sequence is later with prefill chunks
    token_id: int
    end_of_generation: bool


Action = OpenEndpoints | Provision | InjectTokens | DraftWanted | StopStage | CloseEndpoints | Emit | Deliver
