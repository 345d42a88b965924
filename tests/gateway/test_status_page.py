"""The status page over a fake orchestrator: the per-token timeline from a traced run's events and from an untraced
one's, the picture's geometry, the pages' content with every orchestrator string escaped, and the sign-in: the
cookie /login sets opens the pages (not the API), a browser without it is sent to the form."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode

import grpc
import pytest

from swactor.gateway import errors, status_page, timeline
from swactor.gateway.app import build_app
from swactor.gateway.config import GatewayConfig
from swactor.gateway.status_page import safe_next
from swactor.gateway.timeline import Segment, gap_rows, mean_table, picture, traced_rows
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

TOKEN = b"s" * 32
AUTH = {"authorization": "Bearer " + TOKEN.decode()}
EVIL = "<script>alert(1)</script>"
T0 = 1_700_000_000_000_000


# ---- a traced run's events, built from the segments they should give back ----

# One token's segments for 2 stages, in ring order, µs.
RING_US = [("orchestrator", None, 100), ("send", 0, 50), ("quic", 0, 150), ("recv", 0, 100), ("dispatch", 0, 50),
           ("compute", 0, 5000), ("send", 1, 60), ("quic", 1, 140), ("recv", 1, 100), ("dispatch", 1, 40),
           ("compute", 1, 4000), ("send", 2, 70), ("quic", 2, 130), ("recv", 2, 90)]


def ev(kind: int, seq: int, us: int, stage: int | None = None, **counters: int) -> pb.LifecycleEvent:
    e = pb.LifecycleEvent(kind=kind, run_id=5, sequence=seq, time_us=us, counters=counters)
    if stage is not None:
        e.stage_index = stage
    return e


def traced_events(first_seq: int, tokens: int, stages: int = 2, ring=RING_US) -> list[pb.LifecycleEvent]:
    """The events a traced run records for `tokens` tokens, the first at `first_seq` (the last prompt chunk)."""
    out = [ev(pb.TOKEN_RECEIVED, first_seq, T0)]
    t = T0
    for n in range(first_seq + 1, first_seq + tokens):
        marks, at = {}, t
        for kind, index, us in ring:
            at += us
            marks[(kind, index)] = at
        out.append(ev(pb.EDGE_OBJECT_SENT, n, marks[("send", 0)], produced_us=marks[("orchestrator", None)],
                      picked_us=marks[("orchestrator", None)] + 1))
        for h in range(stages + 1):
            stage_in = h if h < stages else None
            out.append(ev(pb.EDGE_OBJECT_RECEIVED, n, marks[("recv", h)] - 1, stage_in, arrived_us=marks[("quic", h)]))
            if h < stages:
                out.append(ev(pb.OBJECT_LOADED, n, marks[("recv", h)], h))
                out.append(ev(pb.EXECUTE_STEP_STARTED, n, marks[("dispatch", h)], h))
                out.append(ev(pb.OBJECT_PRODUCED, n, marks[("compute", h)], h))
                out.append(ev(pb.EDGE_OBJECT_SENT, n, marks[("send", h + 1)], h))
        t = marks[("recv", stages)]
        out.append(ev(pb.TOKEN_RECEIVED, n, t))
    return out


def test_traced_rows_split_each_gap_in_ring_order() -> None:
    rows = traced_rows(traced_events(first_seq=3, tokens=4), stages=2)
    assert [r.token for r in rows] == [1, 2, 3]  # answer indices: the first token (sequence 3) has no gap before it
    want = tuple(Segment(kind, index, us / 1000) for kind, index, us in RING_US)
    assert all(r.segments == want for r in rows)
    assert rows[0].total_ms == pytest.approx(sum(us for *_, us in RING_US) / 1000)


def test_a_late_after_the_fact_stamp_is_clamped_and_the_segments_still_add_up() -> None:
    events = traced_events(first_seq=0, tokens=2)
    produced = next(e for e in events if e.kind == pb.OBJECT_PRODUCED and e.stage_index == 1)
    produced.time_us += 10_000  # reported long after the edge sent its output
    (row,) = traced_rows(events, stages=2)
    parts = {(s.kind, s.index): s.ms for s in row.segments}
    assert parts[("send", 2)] == 0 and parts[("compute", 1)] == pytest.approx(4.07)
    assert row.total_ms == pytest.approx(sum(us for *_, us in RING_US) / 1000)


def test_a_token_missing_an_event_is_left_out() -> None:
    events = [e for e in traced_events(0, 4) if not (e.kind == pb.OBJECT_LOADED and e.sequence == 2)]
    assert [r.token for r in traced_rows(events, 2)] == [1, 3]


def test_untraced_rows_are_the_gaps_between_arrivals() -> None:
    rows = gap_rows([ev(pb.TOKEN_RECEIVED, s, T0 + us) for s, us in ((7, 0), (8, 12_000), (9, 12_500))])
    assert [(r.token, r.segments) for r in rows] == [(1, (Segment("gap", None, 12.0),)),
                                                    (2, (Segment("gap", None, 0.5),))]


def test_mean_table_has_a_column_per_hop_and_stage() -> None:
    table = dict((label.split(":")[0], (cells, total))
                 for label, cells, total in mean_table(traced_rows(traced_events(0, 3), 2), 2))
    assert table["stage compute"] == ([5.0, 4.0, None], 9.0)
    assert table["QUIC transit"][0] == pytest.approx([0.15, 0.14, 0.13])
    assert table["orchestrator"][0] == [0.1, None, None]


def test_picture_draws_a_bar_per_segment_on_one_scale() -> None:
    rows = traced_rows(traced_events(0, 3), 2)
    pic = picture(rows)
    # per row: orchestrator, 3 hops, 2 dispatches, 2 computes
    assert len(pic.bars) == 2 * 8
    right = max(b.x + b.w for b in pic.bars)
    assert timeline.LEFT < right <= pic.width - timeline.RIGHT + 0.01
    assert pic.ticks[0][1] == "0" and float(pic.ticks[-1][1]) >= rows[0].total_ms
    hop1 = next(b for b in pic.bars if "hop 1" in b.title)
    assert hop1.title == "token 1: hop 1 0.30 ms (send 0.06 + quic 0.14 + recv 0.10 ms)"
    assert next(b for b in pic.bars if "compute stage 0" in b.title).fill != hop1.fill


def test_safe_next_stays_on_the_status_pages() -> None:
    assert safe_next("/status/runs/12") == "/status/runs/12"
    assert safe_next("/status?run=3") == "/status?run=3"
    for bad in ("//evil.example/status", "https://evil.example/", "/status/../v1/models", "/status?run=x", None):
        assert safe_next(bad) in ("/status",)


# ---- the pages over a fake orchestrator ----


class RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def run_record(run_id: int, state: int, **kw) -> opb.Run:
    return opb.Run(run_id=run_id, model="smollm2", state=state, stages=2, max_tokens=8, created_us=T0 - 60_000_000,
                   **kw)


RUNS = [
    run_record(9, opb.RUN_STATE_QUEUED, queue_position=1, queue_wait=f"a free run slot {EVIL}", prompt_tokens=12),
    run_record(8, opb.RUN_STATE_RUNNING, token_ids=[1, 2, 3],
               placement=[opb.StagePlacement(stage_index=0, node_id=101), opb.StagePlacement(stage_index=1, node_id=102)]),
    run_record(5, opb.RUN_STATE_DONE, outcome=opb.RUN_OUTCOME_COMPLETED, reason="max_tokens", token_ids=[1] * 8,
               outcome_us=T0 - 58_000_000, text=f"Paris {EVIL}", prompt_tokens=30,
               placement=[opb.StagePlacement(stage_index=0, node_id=101, layer_start=0, layer_end_exclusive=15),
                          opb.StagePlacement(stage_index=1, node_id=102, layer_start=15, layer_end_exclusive=30)]),
    run_record(4, opb.RUN_STATE_DONE, outcome=opb.RUN_OUTCOME_FAULTED, reason="RUN_FAULT_STEP_TIMEOUT",
               detail=f"stage 1 took too long {EVIL}", outcome_us=T0 - 59_000_000),
]
POOL = opb.ListNodesResponse(
    pool_ready=True, pool_detail="2 Available nodes", orchestrator_node_id=101,
    nodes=[opb.Node(node_id=101, hostname="h0", readiness=opb.NODE_READINESS_AVAILABLE, provisionable=True,
                    edge_endpoint="10.0.0.1:7443", control_endpoint="10.0.0.1:7444", stage_memory_bytes=3 << 30,
                    gpus=[opb.NodeGpu(index=0, kind="cuda", name="NVIDIA H200", memory_bytes=141 << 30)],
                    slots_in_use=1, run_slots=4),
           opb.Node(node_id=102, hostname=EVIL, readiness=opb.NODE_READINESS_SUSPECT, reason=f"no ack {EVIL}",
                    edge_endpoint="10.0.0.2:7443")],
    rtts=[opb.NodeRtt(from_node_id=101, to_node_id=102, rtt_ms=1.25)])


@dataclass
class FakeStub:
    runs: dict[int, opb.Run]
    events: dict[int, list[pb.LifecycleEvent]]
    asked: list[tuple[int, int]] = field(default_factory=list)

    async def GetRun(self, req: opb.GetRunRequest, timeout: float) -> opb.Run:
        if req.run_id not in self.runs:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"run {req.run_id} not found")
        return self.runs[req.run_id]

    async def GetEvents(self, req: opb.GetEventsRequest, timeout: float) -> opb.GetEventsResponse:
        self.asked.append((req.run_id, req.kind))
        mine = [e for e in self.events.get(req.run_id, []) if e.kind == req.kind]
        start = int(req.page_token or 0)
        end = start + 3  # small pages: the page loop is exercised
        return opb.GetEventsResponse(events=mine[start:end], next_page_token=str(end) if end < len(mine) else "")


@dataclass
class FakeClient:
    stub: FakeStub
    down: bool = False

    async def pool(self) -> opb.ListNodesResponse:
        if self.down:
            raise errors.unavailable("the orchestrator did not answer ListNodes: connection refused",
                                     code="orchestrator_unavailable")
        return POOL

    async def runs(self, limit: int = 50) -> list[opb.Run]:
        if self.down:
            raise errors.unavailable("the orchestrator did not answer ListRuns", code="orchestrator_unavailable")
        return RUNS

    async def models(self) -> list[opb.ServedModel]:
        return []


def fake(**events: list[pb.LifecycleEvent]) -> FakeClient:
    return FakeClient(FakeStub({r.run_id: r for r in RUNS}, {int(k.removeprefix("run")): v for k, v in events.items()}))


async def call(app, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
               scheme: str = "http") -> tuple[int, dict[str, list[str]], str]:
    path, _, query = path.partition("?")
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()
        raise AssertionError

    async def send(message: dict) -> None:
        sent.append(message)

    hdrs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    hdrs.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "headers": hdrs, "scheme": scheme, "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
             "root_path": ""}
    await app(scope, receive, send)
    got: dict[str, list[str]] = {}
    for k, v in sent[0]["headers"]:
        got.setdefault(k.decode().lower(), []).append(v.decode())
    return sent[0]["status"], got, b"".join(m.get("body", b"") for m in sent[1:]).decode()


def get(client: FakeClient, path: str, headers: dict[str, str] | None = None, **kw) -> tuple[int, dict, str]:
    app = build_app(GatewayConfig(), client, TOKEN)  # type: ignore[arg-type]
    return asyncio.run(call(app, "GET", path, headers=AUTH if headers is None else headers, **kw))


def text_of(html: str) -> str:
    """The page as a reader sees it: no tags, entities decoded, whitespace folded."""
    import html as h

    inline = re.sub(r"</?(span|a)\b[^>]*>", "", html)
    return " ".join(h.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def assert_escaped(html: str) -> None:
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_overview_is_html_that_reloads_itself_and_runs_no_script() -> None:
    status, headers, html = get(fake(), "/status")
    assert status == 200 and headers["content-type"][0].startswith("text/html")
    assert '<meta http-equiv="refresh" content="5">' in html
    assert "default-src 'none'" in headers["content-security-policy"][0]  # and no script-src: no script runs
    assert headers["cache-control"] == ["no-store"]
    assert_escaped(html)
    assert 'id="hosts"' in html and 'id="recent"' in html


def test_overview_shows_the_pool_the_queue_and_the_runs_escaped() -> None:
    html = status_page.overview_page(POOL, RUNS, now_us=T0).body.decode()
    assert_escaped(html)
    page = text_of(html)
    assert "The pool is ready: 2 Available nodes" in page
    assert "101 (orchestrator) h0 available · takes stages cuda 0: NVIDIA H200 141.00 GiB 3.00 GiB 1 / 4 " \
           "10.0.0.1:7443 10.0.0.1:7444" in page
    assert f"102 {EVIL} suspect no ack {EVIL}" in page
    assert "1.25" in page  # the RTT matrix
    assert f"1 9 smollm2 60 s 12 a free run slot {EVIL}" in page  # the queue
    assert "8 smollm2 running 60 s 3 / 8 stage 0: h0, stage 1: " + EVIL in page  # in flight, hosts by name
    assert "completed max_tokens" in page and f"faulted RUN_FAULT_STEP_TIMEOUT stage 1 took too long {EVIL}" in page
    recent = html[html.index('id="recent"'):]
    assert recent.index('href="/status/runs/5"') < recent.index('href="/status/runs/4"')  # newest first
    assert 'href="/status/runs/9"' not in recent


def test_overview_when_the_orchestrator_does_not_answer() -> None:
    client = fake()
    client.down = True
    status, _, html = get(client, "/status")
    assert status == 503 and 'id="error"' in html and "connection refused" in html
    assert 'http-equiv="refresh"' in html  # it keeps trying


def test_traced_run_page_draws_every_stage_and_hop() -> None:
    client = fake(run5=traced_events(first_seq=1, tokens=5))
    status, _, html = get(client, "/status/runs/5")
    assert status == 200
    assert_escaped(html)
    assert 'http-equiv="refresh"' not in html  # the run is over: nothing changes any more
    page = text_of(html)
    assert "This run was traced" in page and "4 token(s) read" not in page and "5 token(s) read" in page
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert svg.count("<rect") == 4 * 8
    assert "token 4: compute stage 1 4.00 ms" in svg
    assert "h0" in text_of(html[html.index('id="placement"'):])
    means = text_of(html[html.index('id="means"'):])
    assert "stage compute 5.00 4.00 9.00" in means
    assert f"Paris {EVIL}" in page  # the answer, escaped
    assert {k for _, k in client.stub.asked} == {pb.TOKEN_RECEIVED, *timeline.TRACE_KINDS}


def test_untraced_run_page_draws_the_gaps_and_says_so() -> None:
    received = [ev(pb.TOKEN_RECEIVED, s, T0 + 20_000 * i) for i, s in enumerate(range(3, 11))]
    client = fake(run8=received)
    status, _, html = get(client, "/status/runs/8")
    page = text_of(html)
    assert status == 200 and "This run was not traced" in page
    assert "8 token(s) read; the first 60 s after the run was submitted; then 50.00 tokens/s" in page
    assert html.count("<rect") == 7
    assert 'http-equiv="refresh"' in html  # still running
    assert {k for _, k in client.stub.asked} == {pb.TOKEN_RECEIVED, pb.EXECUTE_STEP_STARTED}  # no trace: no more asked


def test_run_page_of_an_unknown_run_and_the_query_form() -> None:
    status, _, html = get(fake(), "/status/runs/77")
    assert status == 404 and "no run 77" in html
    status, headers, _ = get(fake(), "/status?run=5")
    assert status == 303 and headers["location"] == ["/status/runs/5"]
    status, _, html = get(fake(), "/status?" + urlencode({"run": EVIL}))
    assert status == 400 and "<script" not in html


# ---- signing in ----


def login(token: str, next_: str = "/status", scheme: str = "http") -> tuple[int, dict, str]:
    app = build_app(GatewayConfig(), fake(), TOKEN)  # type: ignore[arg-type]
    body = urlencode({"token": token, "next": next_}).encode()
    return asyncio.run(call(app, "POST", "/login", body, {"content-type": "application/x-www-form-urlencoded"},
                            scheme=scheme))


def test_a_browser_without_the_cookie_is_sent_to_the_form() -> None:
    status, headers, _ = get(fake(), "/status/runs/5", headers={})
    assert status == 303 and headers["location"] == ["/login?next=%2Fstatus%2Fruns%2F5"]
    status, _, html = get(fake(), "/login?next=%2Fstatus%2Fruns%2F5", headers={})
    assert status == 200 and 'type="password"' in html and 'value="/status/runs/5"' in html
    status, headers, _ = get(fake(), "/v1/models", headers={})  # the API answers as it always did
    assert status == 401 and headers["content-type"] == ["application/json"]


def test_the_right_token_sets_the_cookie_and_it_opens_the_pages_only() -> None:
    status, headers, html = login("wrong" * 8)
    assert status == 401 and "wrong token" in html and "set-cookie" not in headers
    status, headers, _ = login(TOKEN.decode(), next_="/status/runs/5")
    assert status == 303 and headers["location"] == ["/status/runs/5"]
    (cookie,) = headers["set-cookie"]
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "samesite", "path", "max-age"} <= attrs and "secure" not in attrs
    assert "samesite=strict" in cookie.lower() and "Path=/" in cookie
    name_value = cookie.split(";")[0]
    assert TOKEN.decode() not in name_value  # the browser keeps a MAC of it, not the token
    assert get(fake(), "/status", headers={"cookie": name_value})[0] == 200
    assert get(fake(), "/status", headers={"cookie": name_value[:-1] + "0"})[0] == 303
    assert get(fake(), "/v1/models", headers={"cookie": name_value})[0] == 401
    _, headers, _ = login(TOKEN.decode(), next_="https://evil.example/", scheme="https")
    assert headers["location"] == ["/status"] and "secure" in headers["set-cookie"][0].lower()
