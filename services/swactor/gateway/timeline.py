"""A run's per-token timeline, from its events to a picture (pure: events in, rows out; rows in, geometry out).

Every run records TOKEN_RECEIVED (the orchestrator read a token) with a wall-clock stamp: the time between two
tokens' arrivals. A run submitted with trace_objects also records its objects' lifecycle (OBJECT_LOADED,
EXECUTE_STEP_STARTED, OBJECT_PRODUCED per stage, EDGE_OBJECT_SENT / RECEIVED per hop), and each token's gap splits
into the orchestrator's share, each hop and each stage's dispatch and compute, as bench/pipeline.py splits it (see
`traced_rows`). status_page.py draws it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swactor.v1 import common_pb2 as pb

MAX_ROWS = 200  # tokens drawn: the last ones

# ---- the per-token timeline (pure: events in, rows out) ----


@dataclass(frozen=True)
class Segment:
    """Where some of a token's milliseconds went: kind "orchestrator", "send" / "quic" / "recv" (hop `index`: 0 =
    orchestrator -> stage 0, k = stage k-1 -> stage k, S = last stage -> orchestrator), "dispatch" / "compute"
    (stage `index`), or "gap" (untraced: the whole ring at once)."""

    kind: str
    index: int | None
    ms: float


@dataclass(frozen=True)
class TokenRow:
    token: int  # the answer's token index: 0 = the first generated token
    at_us: int  # when the orchestrator read it
    segments: tuple[Segment, ...]

    @property
    def total_ms(self) -> float:
        return sum(s.ms for s in self.segments)


# The kinds a traced run's timeline needs besides TOKEN_RECEIVED.
TRACE_KINDS = (pb.EDGE_OBJECT_SENT, pb.EDGE_OBJECT_RECEIVED, pb.OBJECT_LOADED, pb.EXECUTE_STEP_STARTED,
               pb.OBJECT_PRODUCED)


def _stage(e: pb.LifecycleEvent) -> int | None:
    return e.stage_index if e.HasField("stage_index") else None


def gap_rows(received: Iterable[pb.LifecycleEvent]) -> list[TokenRow]:
    """Per token after the first: the time since the one before reached the orchestrator."""
    at: dict[int, int] = {}
    for e in received:
        at.setdefault(e.sequence, e.time_us)
    seqs = sorted(at)
    return [TokenRow(n - seqs[0], at[n], (Segment("gap", None, max(0, at[n] - at[n - 1]) / 1000),))
            for n in seqs[1:] if n - 1 in at]


def traced_rows(events: Iterable[pb.LifecycleEvent], stages: int) -> list[TokenRow]:
    """Per token after the first, its gap split at every checkpoint its objects passed: TOKEN_RECEIVED(n-1) ->
    token-in committed (orchestrator) -> per hop h: sent (send h) -> its last byte arrived (quic h) -> loaded by the
    consumer (recv h) -> per stage: step started (dispatch) -> output produced (compute) -> ... -> TOKEN_RECEIVED(n).
    OBJECT_PRODUCED / OBJECT_LOADED carry the stage's compute process's stamps (wire.ObjectLoaded.at_us), read from
    the same wall clock as the edge drivers'; a stamp later than the next checkpoint is still clamped back to it, so
    the segments add up to the gap. Tokens with an event missing are left out."""
    at: dict[tuple[int, int | None, int], pb.LifecycleEvent] = {}
    for e in events:
        at.setdefault((e.kind, _stage(e), e.sequence), e)
    seqs = sorted({s for kind, _, s in at if kind == pb.TOKEN_RECEIVED})
    rows = []
    for n in seqs[1:]:
        try:
            marks = _marks(at, n, stages)
        except KeyError:
            continue
        t = [us for _, _, us in marks]
        for i in range(len(t) - 2, -1, -1):
            t[i] = min(t[i], t[i + 1])
        segs = tuple(Segment(kind, index, max(0, t[i] - t[i - 1]) / 1000)
                     for i, (kind, index, _) in enumerate(marks) if i)
        rows.append(TokenRow(n - seqs[0], t[-1], segs))
    return rows


def _marks(at: dict, n: int, stages: int) -> list[tuple[str, int | None, int]]:
    """The checkpoints of token n, each (the segment that ends there, its hop / stage, its stamp)."""
    marks: list[tuple[str, int | None, int]] = [("", None, at[(pb.TOKEN_RECEIVED, None, n - 1)].time_us)]
    for h in range(stages + 1):
        sent = at[(pb.EDGE_OBJECT_SENT, h - 1 if h else None, n)]
        recv = at[(pb.EDGE_OBJECT_RECEIVED, h if h < stages else None, n)]
        if h == 0:
            marks.append(("orchestrator", None, sent.counters["produced_us"] or sent.counters["picked_us"]))
        else:
            marks.append(("compute", h - 1, at[(pb.OBJECT_PRODUCED, h - 1, n)].time_us))
        marks.append(("send", h, sent.time_us))
        marks.append(("quic", h, recv.counters["arrived_us"]))
        if h < stages:
            marks.append(("recv", h, at[(pb.OBJECT_LOADED, h, n)].time_us))
            marks.append(("dispatch", h, at[(pb.EXECUTE_STEP_STARTED, h, n)].time_us))
        else:
            marks.append(("recv", h, at[(pb.TOKEN_RECEIVED, None, n)].time_us))
    return marks


@dataclass(frozen=True)
class Timeline:
    traced: bool  # the rows split each gap (trace_objects); else one "gap" segment each
    rows: list[TokenRow]  # the last MAX_ROWS
    tokens: int  # tokens the orchestrator read
    first_token_us: int | None
    last_token_us: int | None
    all_rows: int  # rows before the cut to MAX_ROWS
    trace_incomplete: bool  # trace events were there but no token had all of them

    def decode_tok_s(self) -> float | None:
        if self.tokens < 2 or not self.first_token_us or self.last_token_us == self.first_token_us:
            return None
        return (self.tokens - 1) / ((self.last_token_us - self.first_token_us) / 1e6)

    def gap_ms(self, q: float) -> float | None:
        """The q-quantile of the drawn tokens' gaps."""
        gaps = sorted(r.total_ms for r in self.rows)
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))] if gaps else None


def timeline(received: Sequence[pb.LifecycleEvent], traced: Sequence[pb.LifecycleEvent], stages: int) -> Timeline:
    rows = traced_rows([*received, *traced], stages) if traced else []
    incomplete = bool(traced) and not rows
    if not rows:
        rows = gap_rows(received)
    stamps = sorted(e.time_us for e in received)
    return Timeline(traced=bool(traced) and not incomplete, rows=rows[-MAX_ROWS:], tokens=len(stamps),
                    first_token_us=stamps[0] if stamps else None, last_token_us=stamps[-1] if stamps else None,
                    all_rows=len(rows), trace_incomplete=incomplete)


# How a traced token's segments are tabled (mean ms per hop / stage), in ring order.
TABLED = (("orchestrator", "orchestrator: FSM, sampling, injecting the token"),
          ("send", "send: ring, wake, pump on the sending host"),
          ("quic", "QUIC transit"),
          ("recv", "receive: ring, wake, load on the receiving host"),
          ("dispatch", "stage node: step dispatch"),
          ("compute", "stage compute"))


def mean_table(rows: Sequence[TokenRow], stages: int) -> list[tuple[str, list[float | None], float]]:
    """Per TABLED kind: (label, mean ms per column 0..S (hop h or stage k; None where none), their sum)."""
    sums: dict[tuple[str, int], float] = {}
    for r in rows:
        for s in r.segments:
            key = (s.kind, s.index or 0)
            sums[key] = sums.get(key, 0.0) + s.ms
    out = []
    for kind, label in TABLED:
        cells = [sums[(kind, i)] / len(rows) if (kind, i) in sums else None for i in range(stages + 1)]
        out.append((label, cells, sum(c for c in cells if c is not None)))
    return out


# ---- the picture (pure: rows in, geometry out) ----

DRAWN = {  # kind: (legend, colour, the lighter colour odd hops / stages get)
    "orchestrator": ("orchestrator: FSM, sampling, injecting the token", "#7f7f7f", "#7f7f7f"),
    "hop": ("hop: send, QUIC, receive (h = 0: orchestrator → stage 0, h = S: last stage → orchestrator)",
            "#9467bd", "#c5b0d5"),
    "dispatch": ("stage node: step dispatch", "#ff7f0e", "#ffbb78"),
    "compute": ("stage compute", "#1f77b4", "#aec7e8"),
    "gap": ("time since the previous token reached the orchestrator", "#2ca02c", "#2ca02c"),
}
WIDTH, LEFT, RIGHT, TOP, BOTTOM = 960, 76, 24, 10, 40


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    fill: str
    title: str


@dataclass(frozen=True)
class Picture:
    width: int
    height: int
    plot_top: int
    plot_bottom: float
    bars: list[Bar]
    ticks: list[tuple[float, str]]  # (x, label) of the vertical grid lines
    labels: list[tuple[float, str]]  # (y, text) of the rows named at the left
    axis: str


def drawn(row: TokenRow) -> list[tuple[str, int | None, float, str]]:
    """A row as drawn: each hop's send, QUIC and receive as one bar (kind, index, ms, what its tooltip says)."""
    out: list[tuple[str, int | None, float, str]] = []
    for s in row.segments:
        if s.kind in ("send", "quic", "recv"):
            part = f"{s.kind} {s.ms:.2f}"
            if out and out[-1][0] == "hop" and out[-1][1] == s.index:
                kind, index, ms, parts = out.pop()
                out.append((kind, index, ms + s.ms, f"{parts} + {part}"))
            else:
                out.append(("hop", s.index, s.ms, part))
        else:
            out.append((s.kind, s.index, s.ms, ""))
    return out


def _step(span: float) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving four to eight ticks over `span`."""
    raw = span / 7
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def picture(rows: Sequence[TokenRow]) -> Picture:
    """One horizontal bar per token, top to bottom in answer order, its segments left to right in ring order; x is
    ms since the previous token reached the orchestrator, one scale for every row."""
    rh = max(3, min(18, 560 // max(1, len(rows))))
    longest = max((r.total_ms for r in rows), default=0.0) or 1.0
    step = _step(longest)
    span = math.ceil(longest / step) * step
    plot_w = WIDTH - LEFT - RIGHT
    bars = []
    for i, r in enumerate(rows):
        x, y = 0.0, TOP + i * rh
        for kind, index, ms, parts in drawn(r):
            what = kind if index is None else f"{kind} {index}" if kind == "hop" else f"{kind} stage {index}"
            detail = f" ({parts} ms)" if parts else ""
            fill = DRAWN[kind][2 if (index or 0) % 2 else 1]
            bars.append(Bar(LEFT + x / span * plot_w, y, ms / span * plot_w, max(1, rh - 1), fill,
                            f"token {r.token}: {what} {ms:.2f} ms{detail}"))
            x += ms
    every = max(1, math.ceil(14 / rh))
    bottom = TOP + len(rows) * rh
    ticks = [(LEFT + k * step / span * plot_w, f"{k * step:g}") for k in range(round(span / step) + 1)]
    labels = [(TOP + i * rh + rh / 2, f"token {r.token}") for i, r in enumerate(rows) if i % every == 0]
    return Picture(WIDTH, bottom + BOTTOM, TOP, bottom, bars, ticks, labels,
                   "ms since the previous token reached the orchestrator")
