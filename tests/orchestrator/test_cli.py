"""The `swactor` CLI as a subprocess against an in-process orchestrator with a fake fleet."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

import pytest

from swactor.cli.main import main as cli_main
from swactor.cli.main import parser, submit_request
from swactor.common.objflags import DEFAULT_DRAFT
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import registry, serving
from .helpers import pool

pytestmark = pytest.mark.timeout(90)


async def cli(sock: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "swactor.cli.main", "--address", f"unix:{sock}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode(), err.decode()


def test_submit_watch_runs_show_events_nodes_stop(tmp_path: Path) -> None:
    tok = registry().get("").tokenizer
    script = [*tok.encode(" Bonjour !"), 2]
    fleet = FakeFleet(script)

    async def main():
        async with serving(tmp_path, fleet, pool(1, 2)) as s:
            await asyncio.sleep(0.06)
            sub = await cli(s.socket, "submit", "--prompt", "Say hi in French", "--stages", "2", "--max-tokens", "9",
                            "--watch", "--events")
            run_id = int(sub[2].split()[1])
            runs = await cli(s.socket, "runs", "--json")
            show = await cli(s.socket, "show", str(run_id))
            events = await cli(s.socket, "events", str(run_id))
            nodes = await cli(s.socket, "nodes")
            stop_done = await cli(s.socket, "stop", str(run_id))
            bad = await cli(s.socket, "submit", "--prompt", "x", "--stages", "5")
            missing = await cli(s.socket, "show", "12345")
            over = await cli(s.socket, "submit", "--prompt", "x", "--max-context", "5000")
            return sub, runs, show, events, nodes, stop_done, bad, missing, over

    sub, runs, show, events, nodes, stop_done, bad, missing, over = asyncio.run(main())
    rc, out, err = sub
    assert rc == 0, err
    assert out == " Bonjour !\n"
    assert "readiness_barrier_passed" in err and "run_torn_down" in err and "completed (eos)" in err
    record = json.loads(runs[1].splitlines()[0])
    assert record["outcome"] == "RUN_OUTCOME_COMPLETED" and record["text"] == " Bonjour !"
    assert "stage 1: node 2 layers 15..30" in show[1] and "  context: 4096 tokens, prompt included" in show[1]
    assert events[1].splitlines()[0].split()[2] == "pool_ready" and "run_torn_down" in events[1].splitlines()[-1]
    assert nodes[1].splitlines()[0].startswith("1 ") and "CUDA H100 80GiB" in nodes[1] and "pool ready" in nodes[1]
    assert stop_done[0] == 0 and "completed (eos)" in stop_done[1]  # stopping a finished run changes nothing
    assert bad[0] == 1 and "FAILED_PRECONDITION" in bad[2] and "5 stage(s) need 5 stage device(s)" in bad[2]
    assert missing[0] == 1 and "NOT_FOUND: unknown run_id 12345" in missing[2]
    assert over[0] == 1 and "INVALID_ARGUMENT" in over[2] and "max_context 5000 is more than model" in over[2]


def test_the_dry_run_counts_a_float16_kv_cache_at_half_and_says_so(tmp_path: Path) -> None:
    """[orchestrator].kv_dtype = "float16": the same placement as the float32 example below, each stage's KV cache per
    run slot half of it (134.1 and 48.8 MiB in float32)."""
    members = tuple(dataclasses.replace(n, memory_bytes=m) for n, m in zip(pool(1, 2), (3 << 30, 1 << 30), strict=True))

    async def main():
        async with serving(tmp_path, FakeFleet([2]), members, kv_dtype="float16") as s:
            return await cli(s.socket, "submit", "--prompt", "Hello", "--stages", "2", "--dry-run")

    rc, out, err = asyncio.run(main())
    assert rc == 0, err
    lines = out.splitlines()
    assert "context 4096, KV cache float16; blocks in proportion to the nodes' memory" in lines[0]
    assert lines[1].startswith("  stage 0: node 1 blocks 0..22 ") and "KV cache 67.0 MiB per run slot" in lines[1]
    assert lines[2].startswith("  stage 1: node 2 blocks 22..30 ") and "KV cache 24.4 MiB per run slot" in lines[2]


def test_submit_dry_run_prints_the_placement_and_starts_nothing(tmp_path: Path) -> None:
    members = tuple(dataclasses.replace(n, memory_bytes=m) for n, m in zip(pool(1, 2, 3), (3 << 30, 1 << 30, 300 << 20),
                                                                              strict=True))

    async def main():
        async with serving(tmp_path, FakeFleet([2]), members, max_slots_per_stage=8) as s:
            deadline = time.monotonic() + 5
            while not s.orch.pool_status(2).ready and time.monotonic() < deadline:  # the gate's window
                await asyncio.sleep(0.01)
            fits = await cli(s.socket, "submit", "--prompt", "Hello", "--stages", "2", "--dry-run")
            as_json = await cli(s.socket, "submit", "--prompt", "Hello", "--node", "2", "--node", "1", "--dry-run", "--json")
            short = await cli(s.socket, "submit", "--prompt", "Hello", "--stages", "3", "--dry-run")
            runs = await cli(s.socket, "runs")
            return fits, as_json, short, runs

    fits, as_json, short, runs = asyncio.run(main())
    rc, out, err = fits
    assert rc == 0, err
    lines = out.splitlines()
    assert "2 stage(s)" in lines[0] and "context 4096, KV cache float32" in lines[0] and "in proportion to the nodes' memory" in lines[0]
    # the two nodes with the most memory, blocks 3:1 by memory (one each, the other 28 split 21:7)
    assert lines[1].startswith("  stage 0: node 1 blocks 0..22 needs ") and "weights " in lines[1] and "of 3.00 GiB" in lines[1]
    assert lines[2].startswith("  stage 1: node 2 blocks 22..30 needs ") and "KV cache 48.8 MiB per run slot" in lines[2]
    assert lines[1].endswith("; holds 8 run slots (max_slots_per_stage 8)") and lines[2].endswith("; holds 8 run slots (max_slots_per_stage 8)")
    assert lines[-2].startswith("pool ready: node(s) 1, 2 Available") and lines[-1] == "SubmitRun would accept it; the run starts now"
    plan = json.loads(as_json[1])
    assert as_json[0] == 0 and [p["node_id"] for p in plan["placement"]] == ["2", "1"]
    assert all(int(p["total_bytes"]) > 0 and p["fits"] and p["run_slots"] == 8 for p in plan["placement"])
    rc, out, err = short
    assert rc == 1 and "stage 2: node 3 blocks" in out and out.splitlines()[3].endswith("; holds no run slot  DOES NOT FIT")
    assert "would be refused: RUN_FAULT_DEVICE_OUT_OF_MEMORY: the model does not fit the nodes' memory: stage 2" in out
    assert runs == (0, "", "")  # nothing was started


def test_stopped_run_exit_code_and_json_stream(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 101, 102], hold_after=1)

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=10))
            watch = asyncio.create_task(cli(s.socket, "watch", str(resp.run_id), "--json"))
            while len(fleet.injected) < 2:
                await asyncio.sleep(0.01)
            stop = await cli(s.socket, "stop", str(resp.run_id), "--detail", "cli stop")
            fleet.release.set()
            return await watch, stop

    (rc, out, _), stop = asyncio.run(main())
    assert stop[0] == 0 and "stopped (operator_stop)" in stop[1]
    assert rc == 3
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["finished"]["outcome"] == "RUN_OUTCOME_STOPPED"
    assert [m["token"]["token_id"] for m in lines if "token" in m] == [100]


def test_queued_runs_in_runs_show_and_watch_and_events_over_pages(tmp_path: Path) -> None:
    fleet = FakeFleet([100 + k % 50 for k in range(1100)] + [2], hold_after=1)

    async def main():
        async with serving(tmp_path, fleet, pool(1), max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)
            first = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=2000))
            while len(fleet.injected) < 2:
                await asyncio.sleep(0.01)
            watched = asyncio.create_task(cli(s.socket, "submit", "--prompt", "y", "--raw", "--max-tokens", "1",
                                              "--watch"))
            while not s.orch.queued():
                await asyncio.sleep(0.01)
            queued = s.orch.live_run_ids()[1]
            runs = await cli(s.socket, "runs")
            show = await cli(s.socket, "show", str(queued))
            fleet.release.set()
            watch = await watched
            events = await cli(s.socket, "events", str(first.run_id))
            return queued, runs, show, watch, events

    queued, runs, show, watch, events = asyncio.run(main())
    line = next(x for x in runs[1].splitlines() if x.startswith(str(queued)))
    assert "queued #1" in line and "running" in runs[1]
    # the running run holds the one run slot of its stage node (the queued one none yet)
    assert runs[1].splitlines()[-1] == "run slots in use per stage node: node 1 1/1", runs[1]
    assert show[0] == 0 and "queued #1" in show[1] and "  queue position: 1 (1 = next)" in show[1]
    assert "  waiting for: a free run slot (1 of 1 in use)" in show[1]
    rc, _, err = watch
    assert rc == 0, err
    assert f"run {queued} (" in err and ", queued at position 1)" in err
    assert "queued: position 1 of 1 waiting" in err and "starting after " in err and "s in the queue" in err
    assert "next, waiting for a free run slot (1 of 1 in use)" in err  # what admission holds the head back for
    kinds = [x.split()[2] for x in events[1].splitlines()]
    assert kinds.count("token_received") == 1101 and kinds[-1] == "run_torn_down"  # more than one page


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli_main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("swactor 0.1.0\npython ") and "grpcio " in out and "tinygrad " in out
    assert cli_main(["demo", "--stages", "3", "--hosts", "2"]) == 2
    assert "cannot hold --stages 3" in capsys.readouterr().err
    assert cli_main(["--address", "unix:/nonexistent/orch.sock", "--timeout", "2", "runs"]) == 1
    assert "cannot reach the orchestrator at unix:/nonexistent/orch.sock" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["watch", "not-a-number"])
    assert "run id 'not-a-number' is not an integer" in capsys.readouterr().err


def test_submit_prompt_ids_and_ignore_eos_flags(capsys: pytest.CaptureFixture[str]) -> None:
    req = submit_request(parser().parse_args(["submit", "--prompt-ids", "2,9690, 198", "--ignore-eos",
                                              "--max-tokens", "8"]))
    assert req.WhichOneof("input") == "prompt_ids" and list(req.prompt_ids.ids) == [2, 9690, 198]
    assert req.ignore_eos and req.max_tokens == 8
    assert not submit_request(parser().parse_args(["submit", "--prompt", "hi"])).ignore_eos
    speculate = [submit_request(parser().parse_args(["submit", "--prompt", "hi", *flag])).speculate
                 for flag in ([], ["--speculate"], ["--speculate", "3"])]
    assert speculate == [0, DEFAULT_DRAFT, 3]
    drafters = [submit_request(parser().parse_args(["submit", "--prompt", "hi", "--speculate", *flag])).drafter
                for flag in ([], ["--drafter", "prompt-lookup"], ["--drafter", "draft-model"])]
    assert drafters == [opb.DRAFTER_AUTO, opb.DRAFTER_PROMPT_LOOKUP, opb.DRAFTER_DRAFT_MODEL]
    for bad, needle in [("1,x", "comma-separated token ids"), ("-3", "0..2^32-1"), ("", "0..2^32-1")]:
        with pytest.raises(SystemExit):
            parser().parse_args(["submit", f"--prompt-ids={bad}"])
        assert needle in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["submit", "--prompt", "hi", "--prompt-ids", "1"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_demo_is_quiet_by_default_and_shows_every_event_with_events(capsys: pytest.CaptureFixture[str]) -> None:
    """Bring-up as per-stage percentages, the answer alone on stdout; --events adds every lifecycle line."""
    from swactor.cli.demo import Printer
    from swactor.localcluster.run import RunResult
    from swactor.v1 import common_pb2 as pb

    def ev(kind: int, **counters: int) -> opb.RunUpdate:
        return opb.RunUpdate(event=pb.LifecycleEvent(kind=kind, stage_index=1, counters=counters))

    updates = [ev(pb.STAGE_PROVISION_STARTED), *(ev(pb.WEIGHTS_LOAD_PROGRESS, layers_loaded=i, layers_total=8)
                                                 for i in range(9)),
               *(ev(pb.COMPILE_PROGRESS, units_done=i, units_total=10) for i in range(11)),
               ev(pb.EDGE_READY), ev(pb.READINESS_BARRIER_PASSED),
               opb.RunUpdate(token=opb.TokenDelta(sequence=0, token_id=5, text="Paris")), ev(pb.STEP_COMPLETED)]
    for events in (False, True):
        out = Printer(as_json=False, events=events)
        for u in updates:
            out.update(u, RunResult())
        got = capsys.readouterr()
        assert got.out == "Paris"
        lines = got.err.splitlines()
        weights = [x for x in lines if "weights" in x]
        compiled = [x for x in lines if "compile" in x]
        if events:
            assert len(weights) == 9 and len(compiled) == 11
            assert any("STAGE_PROVISION_STARTED" in x or "stage_provision_started" in x.lower() for x in lines)
        else:
            assert [w.split("weights ")[1].split("%")[0] for w in weights] == ["0", "25", "50", "75", "100"]
            assert compiled[-1].endswith("compile 100% (10/10 graph calls)") and len(compiled) == 5
            assert len(lines) == len(weights) + len(compiled) + 1  # + the barrier line


async def interrupted_cli(sock: Path, fleet: FakeFleet, *args: str) -> tuple[int, str]:
    """The CLI watching a run, sent Ctrl-C (SIGINT) once the run's first token was injected back."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "swactor.cli.main", "--address", f"unix:{sock}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.read(1), 30)  # the first token's text: the CLI is streaming
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


def test_ctrl_c_on_a_watch_leaves_the_run_going_unless_asked_to_stop_it(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 101, 102], hold_after=1)

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            left = await interrupted_cli(s.socket, fleet, "submit", "--prompt", "x", "--raw", "--max-tokens", "10",
                                         "--watch")
            run_id = s.orch.live_run_ids()[0]
            still = s.orch.get(run_id)
            stopped = await interrupted_cli(s.socket, fleet, "watch", str(run_id), "--stop-on-interrupt")
            fleet.release.set()
            while s.orch.get(run_id).state != opb.RUN_STATE_DONE:
                await asyncio.sleep(0.01)
            return left, still, stopped, s.orch.get(run_id)

    (rc, err), still, (rc2, err2), final = asyncio.run(main())
    assert rc == 130 and f"interrupted; run {still.run_id} goes on" in err and f"swactor stop {still.run_id}" in err
    assert still.state == opb.RUN_STATE_RUNNING  # Ctrl-C ended the watch, not the run
    assert "Traceback" not in err + err2
    assert rc2 == 130 and f"interrupted; stopped run {still.run_id}" in err2
    assert final.outcome == opb.RUN_OUTCOME_STOPPED and "--stop-on-interrupt" in final.detail


def test_a_sampled_run_without_seed_shows_the_seed_it_got(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 2])

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            sampled = await cli(s.socket, "submit", "--prompt", "x", "--raw", "--temperature", "0.7", "--watch")
            greedy = await cli(s.socket, "submit", "--prompt", "x", "--raw", "--watch")
            return sampled, greedy, s.orch.list(2)

    (rc, _, err), (rc2, _, err2), (greedy_run, sampled_run) = asyncio.run(main())
    assert rc == 0 and rc2 == 0, err + err2
    seed = sampled_run.sampling.seed
    assert seed != 0 and f"sampling: temperature 0.7 seed {seed} (replay with --seed {seed})" in err
    assert "seed" not in err2 and greedy_run.sampling.temperature == 0


def test_a_submit_that_timed_out_is_sent_again_under_its_request_id_and_makes_one_run(tmp_path: Path) -> None:
    """The orchestrator made the run but its answer came after the CLI's deadline: the retry gets the same run."""
    fleet = FakeFleet([100, 2])

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            real, ids = s.orch.submit, []

            async def slow_first_answer(req: opb.SubmitRunRequest) -> opb.SubmitRunResponse:
                ids.append(req.client_request_id)
                resp = await real(req)
                if len(ids) == 1:
                    await asyncio.sleep(2.0)  # past the CLI's --timeout 1: it sees DEADLINE_EXCEEDED
                return resp

            s.orch.submit = slow_first_answer  # type: ignore[method-assign]
            out = await cli(s.socket, "--timeout", "1", "submit", "--prompt", "x", "--raw", "--max-tokens", "2")
            return out, ids, s.orch.list(10)

    (rc, out, err), ids, runs = asyncio.run(main())
    assert rc == 0, err
    assert "SubmitRun DEADLINE_EXCEEDED; sending it again" in err
    assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 32  # one request id, sent twice
    assert len(runs) == 1 and out.strip() == str(runs[0].run_id)


def test_demo_shows_a_stage_fault_before_the_outcome_but_not_teardown_racing_teardown(
        capsys: pytest.CaptureFixture[str]) -> None:
    from swactor.cli.demo import Printer
    from swactor.localcluster.run import RunResult
    from swactor.v1 import common_pb2 as pb

    def ev(kind: int, detail: str = "") -> opb.RunUpdate:
        return opb.RunUpdate(event=pb.LifecycleEvent(kind=kind, stage_index=1, reason="RUN_FAULT_STREAM_FAULT",
                                                     detail=detail))

    for events in (False, True):
        out = Printer(as_json=False, events=events)
        for u in (ev(pb.STAGE_FAULTED, "mid-run"), ev(pb.RUN_FAULTED), ev(pb.STAGE_FAULTED, "in teardown")):
            out.update(u, RunResult())
        err = capsys.readouterr().err
        assert "mid-run" in err and "run_faulted" in err
        assert ("in teardown" in err) == events
