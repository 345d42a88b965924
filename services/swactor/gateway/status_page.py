"""The gateway's status page: server-rendered HTML (no script, no front-end build) of the pool, the run queue, the
runs in flight, the recent runs, and for one run a per-token timeline drawn as SVG.

/status                 the pool (hosts, GPUs, readiness, endpoints, run slots, RTTs), the queue, the runs in
                        flight and the recent runs; reloads itself every REFRESH_S seconds
/status/runs/ID         one run: its record, placement and the timeline of its tokens (`/status?run=ID` too)
/login                  a form that takes the gateway's bearer token and sets the cookie the pages accept

A browser cannot send `Authorization: Bearer`, so /login sets a cookie (HttpOnly, SameSite=Strict, Secure over TLS)
holding a value derived from the token (`cookie_value`), not the token itself; app.BearerToken accepts it for the
pages here only (`is_page`), the API still wants the header.

What the timeline shows is what the run's events hold (timeline.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from collections.abc import Iterable
from urllib.parse import parse_qs, quote

import grpc
import jinja2
from starlette.requests import Request, cookie_parser
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from swactor.cli.render import gib, when
from swactor.common.clock import wall_us
from swactor.gateway import errors
from swactor.gateway.errors import ApiError
from swactor.gateway.pool_client import CALL_TIMEOUT_S, PoolClient, refusal
from swactor.gateway.timeline import DRAWN, LEFT, TRACE_KINDS, Timeline, mean_table, picture, timeline
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1.orchestrator_pb2_grpc import OrchestratorStub

LOGIN_PATH = "/login"
PAGE_PATH = "/status"
COOKIE = "swactor_status"
COOKIE_MAX_AGE_S = 12 * 3600
_COOKIE_LABEL = b"swactor-gateway status page cookie v1"
REFRESH_S = 5
RUNS_LISTED = 100  # ListRuns' limit: the queue and the runs in flight are among the newest runs
RECENT_SHOWN = 25  # finished runs shown
MAX_LOGIN_BYTES = 4096
EVENTS_PAGE = 10_000  # GetEvents' largest page
MAX_EVENTS_PER_KIND = 100_000  # a very long traced run is drawn from its first events only
TEXT_SHOWN = 4000  # characters of a run's answer shown
_NEXT = re.compile(r"/status(/runs/\d{1,20})?")
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    # No script at all; the inline <style> and the legend's style attributes are the only styles.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

# ---- the cookie (app.BearerToken checks it) ----


def cookie_value(token: bytes) -> bytes:
    """What the login cookie holds: a MAC of a fixed label under the token, so the browser never stores the token
    and a stolen cookie is no bearer token for the API."""
    return hmac.new(token, _COOKIE_LABEL, hashlib.sha256).hexdigest().encode()


def is_page(path: str) -> bool:
    """The paths the cookie opens (and that send a browser without one to /login)."""
    return path == PAGE_PATH or path.startswith(PAGE_PATH + "/")


def presented_cookie(headers: dict[bytes, bytes]) -> bytes | None:
    raw = headers.get(b"cookie")
    if raw is None:
        return None
    value = cookie_parser(raw.decode("latin-1")).get(COOKIE)
    return None if value is None else value.encode("latin-1")


def to_login(path: str, query: str) -> Response:
    """A browser without a valid cookie: to the form, which sends it back here."""
    target = path + (f"?{query}" if query else "")
    return RedirectResponse(f"{LOGIN_PATH}?next={quote(target, safe='')}", status_code=303,
                            headers={"Cache-Control": "no-store"})


def safe_next(raw: str | None) -> str:
    """Where the login form may send a browser: a status page, never another site."""
    path, _, query = (raw or "").partition("?")
    if not _NEXT.fullmatch(path):
        return PAGE_PATH
    run = parse_qs(query).get("run", [""])[0]
    return f"{path}?run={run}" if run.isdigit() else path


# ---- pages ----

READINESS_CLASS = {"available": "ok", "booting": "wait", "suspect": "warn", "faulted": "bad", "left": "off"}
OUTCOME_CLASS = {"completed": "ok", "faulted": "bad", "stopped": "off"}


def _short(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def readiness(n: opb.Node) -> str:
    return _short(opb.NodeReadiness.Name(n.readiness), "NODE_READINESS_")


def state(run: opb.Run) -> str:
    if run.state == opb.RUN_STATE_QUEUED:
        return f"queued #{run.queue_position}"
    return _short(opb.RunState.Name(run.state), "RUN_STATE_").replace("_", " ")


def outcome(run: opb.Run) -> str:
    return _short(opb.RunOutcome.Name(run.outcome), "RUN_OUTCOME_") if run.outcome else ""


def seconds(us: int) -> str:
    s = us / 1e6
    if s < 120:
        return f"{s:.2f} s" if s < 10 else f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def sort_runs(runs: Iterable[opb.Run]) -> tuple[list[opb.Run], list[opb.Run], list[opb.Run]]:
    """(the queue in its order, the runs in flight oldest first, the finished ones newest first)."""
    runs = list(runs)
    queued = sorted((r for r in runs if r.state == opb.RUN_STATE_QUEUED), key=lambda r: r.queue_position)
    active = sorted((r for r in runs if r.state not in (opb.RUN_STATE_QUEUED, opb.RUN_STATE_DONE)),
                    key=lambda r: r.created_us)
    done = sorted((r for r in runs if r.state == opb.RUN_STATE_DONE), key=lambda r: -r.created_us)
    return queued, active, done[:RECENT_SHOWN]


def rtt_matrix(pool: opb.ListNodesResponse) -> tuple[list[int], dict[tuple[int, int], float]]:
    got = {(r.from_node_id, r.to_node_id): r.rtt_ms for r in pool.rtts}
    ids = sorted({n.node_id for n in pool.nodes} | {a for a, _ in got} | {b for _, b in got})
    return ids, got


BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{% if refresh %}<meta http-equiv="refresh" content="{{ refresh }}">{% endif %}
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · swactor</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
header { display: flex; gap: 1.5em; align-items: baseline; border-bottom: 1px solid #ccc; padding: .6em 0; }
header a { font-weight: 600; color: #222; text-decoration: none; }
header .when { color: #666; margin-left: auto; }
h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; margin: .3em 0; }
th, td { border: 1px solid #ddd; padding: .25em .55em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #17702a; } .bad { color: #b3261e; } .warn { color: #a05a00; } .wait, .off, .dim { color: #777; }
.badge { font-weight: 600; }
.error { background: #fdecea; border: 1px solid #f5c2c0; padding: .5em .8em; }
.note { color: #555; max-width: 70em; }
.legend .item { white-space: nowrap; }
.legend span.swatch { display: inline-block; width: .9em; height: .9em; vertical-align: -.1em; margin: 0 .3em 0 1em; }
pre { white-space: pre-wrap; background: #f7f7f7; padding: .6em; max-width: 80em; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
</style></head>
<body>
<header><a href="/status">swactor status</a>{% block crumbs %}{% endblock %}
<span class="when">{{ now_us|when }} UTC{% if refresh %} · reloads every {{ refresh }} s{% endif %}</span></header>
<main>
{% if error %}<p class="error" id="error">{{ error }}</p>{% endif %}
{% block main %}{% endblock %}
</main></body></html>
"""

OVERVIEW = """{% extends "base" %}
{% block main %}
{% if pool is not none %}
<h2>Pool</h2>
<p id="pool">The pool is <span class="badge {{ 'ok' if pool.pool_ready else 'warn' }}">{{ 'ready' if pool.pool_ready
  else 'not ready' }}</span>{% if pool.pool_detail %}: {{ pool.pool_detail }}{% endif %}. {{ pool.nodes|length }}
  node(s); the orchestrator runs on node {{ pool.orchestrator_node_id }}.</p>
<table id="hosts">
<tr><th>node</th><th>host</th><th>state</th><th>GPUs</th><th>stage memory</th><th>run slots in use</th>
<th>edge endpoint</th><th>control endpoint</th></tr>
{% for n in pool.nodes %}
<tr><td>{{ n.node_id }}{% if n.node_id == pool.orchestrator_node_id %} <span class="dim">(orchestrator)</span>{% endif %}</td>
<td>{{ n.hostname or '-' }}</td>
<td><span class="badge {{ readiness_class[n|readiness] }}">{{ n|readiness }}</span>{% if n.provisionable %} · takes
  stages{% endif %}{% if n.reason %}<br><span class="dim">{{ n.reason }}</span>{% endif %}</td>
<td>{% for g in n.gpus %}{{ g.kind }} {{ g.index }}: {{ g.name }}{% if g.memory_bytes %} {{ g.memory_bytes|gib }}{% endif %}{% if not loop.last %}<br>{% endif %}{% else %}<span class="dim">none</span>{% endfor %}</td>
<td class="num">{{ n.stage_memory_bytes|gib if n.stage_memory_bytes else '-' }}</td>
<td class="num">{{ '%d / %d'|format(n.slots_in_use, n.run_slots) if n.run_slots else '-' }}</td>
<td>{{ n.edge_endpoint or '-' }}</td><td>{{ n.control_endpoint or '-' }}</td></tr>
{% endfor %}
</table>
{% if rtt_ids %}
<table id="rtts"><caption class="note">Round trips between nodes, ms (the row's node measured it)</caption>
<tr><th></th>{% for b in rtt_ids %}<th>{{ b }}</th>{% endfor %}</tr>
{% for a in rtt_ids %}<tr><th>{{ a }}</th>{% for b in rtt_ids %}<td class="num">{% if a == b %}-{% elif (a, b) in rtts %}{{ '%.2f'|format(rtts[(a, b)]) }}{% else %}?{% endif %}</td>{% endfor %}</tr>
{% endfor %}
</table>
{% else %}<p class="note">No round trip between nodes measured yet.</p>{% endif %}
{% endif %}
{% if runs is not none %}
<h2>Queue</h2>
{% if queued %}
<table id="queue"><tr><th>place</th><th>run</th><th>model</th><th>waiting</th><th>prompt tokens</th><th>held back by</th></tr>
{% for r in queued %}<tr><td class="num">{{ r.queue_position }}</td><td><a href="/status/runs/{{ r.run_id }}">{{ r.run_id }}</a></td>
<td>{{ r.model }}</td><td class="num">{{ (now_us - r.created_us)|seconds }}</td><td class="num">{{ r.prompt_tokens }}</td>
<td>{{ r.queue_wait or '-' }}</td></tr>{% endfor %}
</table>
{% else %}<p id="queue" class="note">No run waits.</p>{% endif %}
<h2>Runs in flight</h2>
{% if active %}
<table id="in-flight"><tr><th>run</th><th>model</th><th>state</th><th>running for</th><th>tokens</th><th>placement</th></tr>
{% for r in active %}<tr><td><a href="/status/runs/{{ r.run_id }}">{{ r.run_id }}</a></td><td>{{ r.model }}</td>
<td>{{ r|state }}</td><td class="num">{{ (now_us - r.created_us)|seconds }}</td>
<td class="num">{{ r.token_ids|length }} / {{ r.max_tokens }}</td>
<td>{% for p in r.placement %}stage {{ p.stage_index }}: {{ hosts.get(p.node_id, p.node_id) }}{% if not loop.last %}, {% endif %}{% else %}-{% endfor %}</td></tr>{% endfor %}
</table>
{% else %}<p id="in-flight" class="note">No run in flight.</p>{% endif %}
<h2>Recent runs</h2>
{% if done %}
<table id="recent"><tr><th>run</th><th>submitted (UTC)</th><th>model</th><th>stages</th><th>prompt</th><th>tokens</th>
<th>took</th><th>outcome</th><th>reason</th><th>detail</th></tr>
{% for r in done %}<tr><td><a href="/status/runs/{{ r.run_id }}">{{ r.run_id }}</a></td><td>{{ r.created_us|when }}</td>
<td>{{ r.model }}</td><td class="num">{{ r.stages }}</td><td class="num">{{ r.prompt_tokens }}</td>
<td class="num">{{ r.token_ids|length }} / {{ r.max_tokens }}</td>
<td class="num">{{ (r.outcome_us - r.created_us)|seconds if r.outcome_us else '-' }}</td>
<td><span class="badge {{ outcome_class.get(r|outcome, '') }}">{{ r|outcome or '-' }}</span></td>
<td>{{ r.reason or '-' }}</td><td>{{ r.detail }}</td></tr>{% endfor %}
</table>
<p class="note">The newest {{ done|length }} finished run(s) among the newest {{ listed }} runs the orchestrator keeps.</p>
{% else %}<p id="recent" class="note">No finished run.</p>{% endif %}
{% endif %}
{% endblock %}
"""

RUN = """{% extends "base" %}
{% block crumbs %}<span>run {{ run_id }}</span>{% endblock %}
{% block main %}
{% if run %}
<h2>Run {{ run.run_id }}</h2>
<table id="run">
<tr><th>model</th><td>{{ run.model }}</td></tr>
<tr><th>state</th><td>{{ run|state }}{% if run.queue_wait %}: {{ run.queue_wait }}{% endif %}</td></tr>
<tr><th>outcome</th><td><span class="badge {{ outcome_class.get(run|outcome, '') }}">{{ run|outcome or '-' }}</span>{% if run.reason %} ({{ run.reason }}){% endif %}</td></tr>
{% if run.detail %}<tr><th>detail</th><td>{{ run.detail }}</td></tr>{% endif %}
<tr><th>submitted</th><td>{{ run.created_us|when }} UTC{% if run.client_request_id %} · client request {{ run.client_request_id }}{% endif %}</td></tr>
<tr><th>ended</th><td>{% if run.outcome_us %}{{ run.outcome_us|when }} UTC, after {{ (run.outcome_us - run.created_us)|seconds }}{% else %}-{% endif %}{% if run.torn_down_us %}; torn down {{ (run.torn_down_us - run.outcome_us)|seconds }} later{% endif %}</td></tr>
<tr><th>tokens</th><td>{{ run.prompt_tokens }} in the prompt, {{ run.token_ids|length }} generated of at most {{ run.max_tokens }}{% if run.max_context %}; context {{ run.max_context }}{% endif %}</td></tr>
<tr><th>sampling</th><td>{% if run.sampling.temperature > 0 %}temperature {{ '%g'|format(run.sampling.temperature) }}{% if run.sampling.top_k %}, top-k {{ run.sampling.top_k }}{% endif %}{% if 0 < run.sampling.top_p < 1 %}, top-p {{ '%g'|format(run.sampling.top_p) }}{% endif %}, seed {{ run.sampling.seed }}{% else %}greedy{% endif %}</td></tr>
</table>
{% if run.placement %}
<table id="placement"><tr><th>stage</th><th>node</th><th>host</th><th>layers</th></tr>
{% for p in run.placement %}<tr><td class="num">{{ p.stage_index }}</td><td>{{ p.node_id }}</td><td>{{ hosts.get(p.node_id, '-') }}</td>
<td>{{ p.layer_start }} .. {{ p.layer_end_exclusive - 1 }}</td></tr>{% endfor %}
</table>
{% endif %}
<h2>Per-token timeline</h2>
{% if tl is none %}
{% elif not tl.rows %}
<p class="note" id="timeline-note">{% if tl.tokens %}One token so far: a timeline needs two.{% else %}No token yet.{% endif %}</p>
{% else %}
<p class="note" id="timeline-note">{% if tl.traced %}This run was traced (trace_objects): each bar is one token, split
into where its milliseconds went between the previous token and this one reaching the orchestrator: the orchestrator's
share (sampling, writing the token in), then in ring order each hop h (send, QUIC transit, receive; h = 0 is
orchestrator → stage 0, h = {{ run.stages }} is the last stage → orchestrator) and each stage's step dispatch and
compute. Stamps come from each host's clock: across hosts, a clock offset shows in the QUIC segments.
{% else %}This run was not traced, so each bar is the whole time between the previous token and this one reaching the
orchestrator (every hop and every stage's compute together). Submit a run with trace_objects to see it split per stage
and hop.{% if tl.trace_incomplete %} (Its trace events are there, but no token had all of them.){% endif %}
{% endif %} Hover a bar for its figures.
{% if tl.all_rows > tl.rows|length %}The last {{ tl.rows|length }} of {{ tl.all_rows }} tokens are drawn.{% endif %}</p>
<p id="timeline-stats">{{ tl.tokens }} token(s) read{% if tl.first_token_us %}; the first {{ (tl.first_token_us - run.created_us)|seconds }} after the run was submitted{% endif %}{% if tl.decode_tok_s() %}; then {{ '%.2f'|format(tl.decode_tok_s()) }} tokens/s{% endif %}; gap between tokens p50 {{ '%.2f'|format(tl.gap_ms(0.5)) }} ms, p90 {{ '%.2f'|format(tl.gap_ms(0.9)) }} ms.</p>
<svg id="timeline" role="img" aria-label="per-token timeline of run {{ run.run_id }}" xmlns="http://www.w3.org/2000/svg"
 width="{{ pic.width }}" height="{{ pic.height }}" viewBox="0 0 {{ pic.width }} {{ pic.height }}">
{% for x, label in pic.ticks %}<line x1="{{ '%.1f'|format(x) }}" x2="{{ '%.1f'|format(x) }}" y1="{{ pic.plot_top }}" y2="{{ pic.plot_bottom }}" stroke="#e3e3e3"/>
<text x="{{ '%.1f'|format(x) }}" y="{{ pic.plot_bottom + 14 }}" text-anchor="middle">{{ label }}</text>
{% endfor %}
{% for b in pic.bars %}<rect x="{{ '%.2f'|format(b.x) }}" y="{{ b.y }}" width="{{ '%.2f'|format(b.w) }}" height="{{ b.h }}" fill="{{ b.fill }}"><title>{{ b.title }}</title></rect>
{% endfor %}
{% for y, text in pic.labels %}<text x="{{ left - 6 }}" y="{{ '%.1f'|format(y + 4) }}" text-anchor="end">{{ text }}</text>
{% endfor %}
<text x="{{ left + (pic.width - left) / 2 }}" y="{{ pic.plot_bottom + 32 }}" text-anchor="middle">{{ pic.axis }}</text>
</svg>
<p class="legend">{% for kind in legend %}<span class="item"><span class="swatch" style="background: {{ drawn[kind][1] }}"></span>{{ drawn[kind][0] }}</span> {% endfor %}
{% if tl.traced %}<br><span class="note">Odd hops and stages are drawn lighter.</span>{% endif %}</p>
{% if table %}
<table id="means"><caption class="note">Mean ms per token over the {{ tl.rows|length }} tokens drawn (columns: hop / stage index)</caption>
<tr><th>segment</th>{% for i in range(run.stages + 1) %}<th>{{ i }}</th>{% endfor %}<th>sum</th></tr>
{% for label, cells, total in table %}<tr><td>{{ label }}</td>{% for c in cells %}<td class="num">{{ '%.2f'|format(c) if c is not none else '' }}</td>{% endfor %}<td class="num">{{ '%.2f'|format(total) }}</td></tr>
{% endfor %}
</table>
{% endif %}
{% endif %}
{% if run.text %}
<details><summary>The answer's text{% if run.text|length > text_shown %} (its first {{ text_shown }} characters){% endif %}</summary>
<pre id="answer">{{ run.text[:text_shown] }}</pre></details>
{% endif %}
{% if refresh %}<p class="note">The run is not over: this page reloads every {{ refresh }} s.</p>{% endif %}
{% endif %}
{% endblock %}
"""

LOGIN = """{% extends "base" %}
{% block main %}
<h2>Sign in</h2>
<form method="post" action="/login">
<p class="note">The status page takes the gateway's bearer token (the one API clients send; the file
[gateway].token_file). It is kept as a cookie for {{ hours }} hours in this browser.</p>
<input type="hidden" name="next" value="{{ next }}">
<p><label>Token <input type="password" name="token" id="token" autocomplete="current-password" size="48" autofocus></label>
<button type="submit" id="sign-in">Sign in</button></p>
</form>
{% endblock %}
"""

_env = jinja2.Environment(loader=jinja2.DictLoader({"base": BASE, "overview": OVERVIEW, "run": RUN, "login": LOGIN}),
                          autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_env.filters.update(when=when, gib=gib, seconds=seconds, readiness=readiness, state=state, outcome=outcome)
_env.globals.update(readiness_class=READINESS_CLASS, outcome_class=OUTCOME_CLASS, drawn=DRAWN, left=LEFT,
                    text_shown=TEXT_SHOWN)


def render(template: str, status: int = 200, **context) -> HTMLResponse:
    context.setdefault("error", None)
    context.setdefault("refresh", None)
    context.setdefault("now_us", wall_us())
    return HTMLResponse(_env.get_template(template).render(**context), status_code=status, headers=SECURITY_HEADERS)


def overview_page(pool: opb.ListNodesResponse | None, runs: list[opb.Run] | None, now_us: int,
                  error: str | None = None, status: int = 200) -> HTMLResponse:
    queued, active, done = sort_runs(runs or [])
    ids, rtts = rtt_matrix(pool) if pool is not None else ([], {})
    hosts = {n.node_id: n.hostname or str(n.node_id) for n in pool.nodes} if pool is not None else {}
    return render("overview", status, title="Status", now_us=now_us, refresh=REFRESH_S, error=error, pool=pool,
                  runs=runs, queued=queued, active=active, done=done, listed=RUNS_LISTED, rtt_ids=ids, rtts=rtts,
                  hosts=hosts)


def run_page(run_id: int, run: opb.Run | None, tl: Timeline | None, pool: opb.ListNodesResponse | None,
             now_us: int, error: str | None = None, status: int = 200) -> HTMLResponse:
    hosts = {n.node_id: n.hostname or "-" for n in pool.nodes} if pool is not None else {}
    over = run is not None and run.state == opb.RUN_STATE_DONE
    pic = picture(tl.rows) if tl is not None and tl.rows else None
    table = mean_table(tl.rows, run.stages) if tl is not None and tl.traced and tl.rows and run is not None else None
    legend = ["orchestrator", "hop", "dispatch", "compute"] if tl is not None and tl.traced else ["gap"]
    return render("run", status, title=f"Run {run_id}", now_us=now_us, refresh=None if over or run is None else REFRESH_S,
                  error=error, run_id=run_id, run=run, tl=tl, pic=pic, table=table, legend=legend, hosts=hosts)


# ---- the orchestrator calls the pages make beyond PoolClient's ----


async def get_run(stub: OrchestratorStub, run_id: int) -> opb.Run:
    try:
        return await stub.GetRun(opb.GetRunRequest(run_id=run_id), timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as e:
        if e.code() is grpc.StatusCode.NOT_FOUND:
            raise errors.not_found(f"no run {run_id}: {e.details()}") from None
        raise refusal(e, "GetRun") from None


async def events_of(stub: OrchestratorStub, run_id: int, kind: int, limit: int = MAX_EVENTS_PER_KIND) -> list[pb.LifecycleEvent]:
    """A run's events of one kind, a page at a time, at most about `limit`."""
    out: list[pb.LifecycleEvent] = []
    token = ""
    try:
        while True:
            page = await stub.GetEvents(opb.GetEventsRequest(run_id=run_id, kind=kind, page_size=EVENTS_PAGE,
                                                             page_token=token), timeout=CALL_TIMEOUT_S)
            out.extend(page.events)
            token = page.next_page_token
            if not token or len(out) >= limit:
                return out
    except grpc.aio.AioRpcError as e:
        raise refusal(e, "GetEvents") from None


async def run_timeline(stub: OrchestratorStub, run: opb.Run) -> Timeline:
    """The run's token events, and its trace events when it was traced (a traced run has EXECUTE_STEP_STARTED)."""
    received, probe = await asyncio.gather(events_of(stub, run.run_id, pb.TOKEN_RECEIVED),
                                           events_of(stub, run.run_id, pb.EXECUTE_STEP_STARTED))
    traced: list[pb.LifecycleEvent] = []
    if probe:
        rest = [k for k in TRACE_KINDS if k != pb.EXECUTE_STEP_STARTED]
        for events in await asyncio.gather(*(events_of(stub, run.run_id, k) for k in rest)):
            traced += events
        traced += probe
    return timeline(received, traced, run.stages)


# ---- routes ----


class StatusPages:
    def __init__(self, client: PoolClient, token: bytes) -> None:
        self.client = client
        self._want = hashlib.sha256(token).digest()
        self._cookie = cookie_value(token).decode()

    async def overview(self, request: Request) -> Response:
        if (run := request.query_params.get("run")) is not None:
            if not run.isdigit():
                return render("overview", 400, title="Status", error=f"?run= takes a run id, got {run!r}", pool=None,
                              runs=None)
            return RedirectResponse(f"{PAGE_PATH}/runs/{int(run)}", status_code=303)
        now, problems = wall_us(), []
        pool, runs = await asyncio.gather(self.client.pool(), self.client.runs(RUNS_LISTED), return_exceptions=True)
        for got in (pool, runs):
            if isinstance(got, ApiError):
                problems.append(got)
            elif isinstance(got, BaseException):
                raise got
        return overview_page(None if isinstance(pool, BaseException) else pool,
                             None if isinstance(runs, BaseException) else runs, now,
                             error="; ".join(p.message for p in problems) or None,
                             status=max((p.status for p in problems), default=200))

    async def run(self, request: Request) -> Response:
        run_id = int(request.path_params["run_id"])
        now = wall_us()
        try:
            run = await get_run(self.client.stub, run_id)
            tl = await run_timeline(self.client.stub, run)
        except ApiError as e:
            return run_page(run_id, None, None, None, now, error=e.message, status=e.status)
        try:
            pool = await self.client.pool()
        except ApiError:
            pool = None  # hostnames only
        return run_page(run_id, run, tl, pool, now)

    async def login_form(self, request: Request) -> Response:
        return render("login", title="Sign in", next=safe_next(request.query_params.get("next")),
                      hours=COOKIE_MAX_AGE_S // 3600)

    async def login(self, request: Request) -> Response:
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > MAX_LOGIN_BYTES:
                return render("login", 413, title="Sign in", next=PAGE_PATH, hours=COOKIE_MAX_AGE_S // 3600,
                              error="the form is larger than a token")
        form = parse_qs(body.decode("utf-8", "replace"))
        given = form.get("token", [""])[0].strip().encode()
        target = safe_next(form.get("next", [None])[0])
        if not hmac.compare_digest(hashlib.sha256(given).digest(), self._want):
            return render("login", 401, title="Sign in", next=target, hours=COOKIE_MAX_AGE_S // 3600,
                          error="wrong token")
        response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
        response.set_cookie(COOKIE, self._cookie, max_age=COOKIE_MAX_AGE_S, path="/", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
        return response


def routes(client: PoolClient, token: bytes) -> list[Route]:
    pages = StatusPages(client, token)
    return [Route(PAGE_PATH, pages.overview, methods=["GET"]),
            Route(PAGE_PATH + "/runs/{run_id:int}", pages.run, methods=["GET"]),
            Route(LOGIN_PATH, pages.login_form, methods=["GET"]),
            Route(LOGIN_PATH, pages.login, methods=["POST"])]
