"""The `swactor` CLI as an operator meets it: a table of bad invocations, each run as a real process. Every one ends
in one line naming what was wrong, no traceback, and the exit status `swactor --help` documents (2: a bad argument,
nothing sent; 1: refused or failed). `swactor demo`'s checks answer before anything is created."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from swactor.cli.args import EXIT_FAILED, EXIT_USAGE
from swactor.localcluster.cluster import DEFAULT_MODEL

pytestmark = pytest.mark.timeout(180)

NOWHERE = "unix:/nonexistent/swactor/orchestrator.sock"
NOT_UTF8 = os.fsdecode(b"caf\xe9 \xff")  # Latin-1 bytes in a UTF-8 world, as argv hands them to Python

# (argv, status, what the one line must say)
CASES: list[tuple[list[str], int, str]] = [
    ([], EXIT_USAGE, "the following arguments are required: COMMAND"),
    (["bogus"], EXIT_USAGE, "invalid choice: 'bogus'"),
    (["submit"], EXIT_USAGE, "one of the arguments --prompt --message --prompt-ids is required"),
    (["submit", "--prompt"], EXIT_USAGE, "argument --prompt: expected one argument"),
    (["submit", "--prompt", "hi", "--max-tokens", "0"], EXIT_USAGE, "--max-tokens: must be in 1..2147483647, got 0"),
    (["submit", "--prompt", "hi", "--max-tokens", "2147483648"], EXIT_USAGE, "--max-tokens: must be in"),
    (["submit", "--prompt", "hi", "--max-tokens", "lots"], EXIT_USAGE, "--max-tokens: 'lots' is not an integer"),
    (["submit", "--prompt", "hi", "--stages", "0"], EXIT_USAGE, "--stages: must be in 1..4294967295"),
    (["submit", "--prompt", "hi", "--speculate", "17"], EXIT_USAGE, "--speculate: must be in 0..16, got 17"),
    (["submit", "--prompt", "hi", "--speculate", "--drafter", "model"], EXIT_USAGE,
     "--drafter: invalid choice: 'model' (choose from 'auto', 'prompt-lookup', 'draft-model')"),
    (["submit", "--prompt", "hi", "--stages", "4294967296"], EXIT_USAGE, "--stages: must be in"),
    (["submit", "--prompt", "hi", "--top-k", "-1"], EXIT_USAGE, "--top-k: must be in 0..4294967295"),
    (["submit", "--prompt", "hi", "--top-p", "1.01"], EXIT_USAGE, "--top-p: must be in [0, 1], got 1.01"),
    (["submit", "--prompt", "hi", "--top-p", "nan"], EXIT_USAGE, "--top-p: must be a finite number"),
    (["submit", "--prompt", "hi", "--temperature", "-1"], EXIT_USAGE, "--temperature: must be in [0,"),
    (["submit", "--prompt", "hi", "--temperature", "inf"], EXIT_USAGE, "--temperature: must be a finite number"),
    (["submit", "--prompt", "hi", "--temperature", "1e39"], EXIT_USAGE, "--temperature: must be in"),
    (["submit", "--prompt", "hi", "--seed", "-1"], EXIT_USAGE, "--seed: must be in 0..18446744073709551615"),
    (["submit", "--prompt", "hi", "--seed", str(2**64)], EXIT_USAGE, "--seed: must be in"),
    (["submit", "--prompt", "hi", "--node", "0"], EXIT_USAGE, "--node: must be in 1..18446744073709551615"),
    (["submit", "--prompt-ids", "1,x"], EXIT_USAGE, "--prompt-ids: wants comma-separated token ids"),
    (["submit", "--prompt-ids", str(2**32)], EXIT_USAGE, "--prompt-ids: wants token ids in 0..2^32-1"),
    (["submit", "--message", "no role here"], EXIT_USAGE, "--message: wants ROLE:TEXT"),
    (["submit", "--message", "wizard:hi"], EXIT_USAGE, "--message: role 'wizard' is not one of"),
    (["submit", "--prompt", "  "], EXIT_USAGE, "--prompt is empty"),
    (["submit", "--prompt-ids", "1", "--raw"], EXIT_USAGE, "--raw applies to --prompt only"),
    (["submit", "--prompt", "hi", "--stop-on-interrupt"], EXIT_USAGE, "--stop-on-interrupt applies to --watch only"),
    (["submit", "--prompt", "hi", "--retries", "11"], EXIT_USAGE, "--retries: must be in 0..10"),
    (["submit", "--prompt", NOT_UTF8], EXIT_USAGE, "--prompt: is not valid UTF-8 (byte 0xe9 at offset 3)"),
    (["submit", "--prompt", "hi", "--model", NOT_UTF8], EXIT_USAGE, "--model: is not valid UTF-8"),
    (["submit", "--message", "user:" + NOT_UTF8], EXIT_USAGE, "--message: is not valid UTF-8"),
    (["stop", "1", "--detail", NOT_UTF8], EXIT_USAGE, "--detail: is not valid UTF-8"),
    (["watch", "abc"], EXIT_USAGE, "run id 'abc' is not an integer"),
    (["watch", "0"], EXIT_USAGE, "run id 0 is out of range"),
    (["show", str(2**64)], EXIT_USAGE, "is out of range"),
    (["runs", "--limit", "0"], EXIT_USAGE, "--limit: must be in 1..1000"),
    (["runs", "--limit", "1001"], EXIT_USAGE, "--limit: must be in 1..1000"),
    (["--timeout", "0", "runs"], EXIT_USAGE, "--timeout: must be in (0, 86400]"),
    (["--timeout", "nan", "runs"], EXIT_USAGE, "--timeout: must be a finite number"),
    (["--address", "localhost", "runs"], EXIT_USAGE, "--address: 'localhost' is neither unix:/path nor HOST:PORT"),
    (["--address", "unix:", "runs"], EXIT_USAGE, "--address: unix: needs a socket path"),
    (["--address", "10.0.0.2:70000", "runs"], EXIT_USAGE, "--address: '10.0.0.2:70000' is neither"),
    (["--address", "h:1", "--tls-server-name", "a b", "runs"], EXIT_USAGE, "'a b' is not a host name"),
    (["--address", "h:1", "--token-file", "/etc/hostname", "runs"], EXIT_USAGE, "--token-file needs --tls-ca"),
    (["--address", "h:1", "--tls-ca", "/nonexistent/ca.pem", "runs"], EXIT_USAGE,
     "--tls-ca /nonexistent/ca.pem: No such file or directory"),
    (["--address", NOWHERE, "--tls-ca", "/etc/hostname", "runs"], EXIT_USAGE, "--tls-ca is for the TCP API"),
    (["--address", "127.0.0.1:9", "--tls-ca", "/etc/hostname", "runs"], EXIT_USAGE,
     "--tls-ca /etc/hostname is not a PEM certificate"),
    (["--address", NOWHERE, "--timeout", "2", "runs"], EXIT_FAILED, f"cannot reach the orchestrator at {NOWHERE}"),
    (["--address", NOWHERE, "submit", "--prompt", "hi", "--retries", "0"], EXIT_FAILED, "cannot reach the orchestrator"),
    (["demo", "--hosts", "0"], EXIT_USAGE, "--hosts: must be in 1..253, got 0"),
    (["demo", "--hosts", "300"], EXIT_USAGE, "--hosts: must be in 1..253, got 300"),
    (["demo", "--hosts", "2", "--stages", "3"], EXIT_USAGE, "--hosts 2 cannot hold --stages 3"),
    (["demo", "--prompt", " "], EXIT_USAGE, "--prompt is empty"),
    (["demo", "--top-p", "2"], EXIT_USAGE, "--top-p: must be in [0, 1]"),
    (["demo", "--model", "/nonexistent/m.gguf"], EXIT_USAGE, "--model /nonexistent/m.gguf: no such file"),
    (["demo", "--model", "/etc/hostname"], EXIT_USAGE, "--model /etc/hostname:"),
    (["demo", "--model", NOT_UTF8], EXIT_USAGE, "--model: is not valid UTF-8"),
]
# The local pool's link conditions (tests/localcluster/test_link_arguments.py has python -m swactor.localcluster's)
LINK_CASES: list[tuple[list[str], int, str]] = [
    (["demo", "--link-delay-ms", "10001"], EXIT_USAGE, "--link-delay-ms: must be in 0..10000, got 10001"),
    (["demo", "--link-delay-ms", "40", "--link-jitter-ms", "50"], EXIT_USAGE,
     "swactor demo: argument --link-jitter-ms: must be in 0..40 (at most --link-delay-ms), got 50"),
    (["demo", "--link-loss-pct", "-1"], EXIT_USAGE, "--link-loss-pct: must be in [0, 100], got -1"),
    (["demo", "--link-rate-mbit", "0"], EXIT_USAGE, "--link-rate-mbit: must be in (0, 100000], got 0"),
    (["demo", "--link-rate-mbit", "inf"], EXIT_USAGE, "--link-rate-mbit: must be a finite number"),
]
# Judged against the default model's header (30 layers, a 4096-token context here) before any host exists.
MODEL_CASES: list[tuple[list[str], int, str]] = [
    (["demo", "--stages", "31"], EXIT_USAGE, "--stages 31: model SmolLM2-135M-Instruct.Q4_1.gguf has 30 layers"),
    (["demo", "--stages", "300"], EXIT_USAGE, "--stages 300: model SmolLM2-135M-Instruct.Q4_1.gguf has 30 layers"),
    (["demo", "--max-tokens", "5000"], EXIT_USAGE, "--max-tokens 5000: the context holds 4096 tokens"),
]


def swactor(argv: list[str], tmp: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWACTOR_")}
    return subprocess.run([sys.executable, "-m", "swactor.cli.main", *(os.fsencode(a) for a in argv)],
                          capture_output=True, timeout=60, env={**env, "TMPDIR": tmp}, stdin=subprocess.DEVNULL)


def run_table(cases: list[tuple[list[str], int, str]], tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: swactor(case[0], str(tmp_path)), cases))
    wrong = []
    for (argv, status, needle), proc in zip(cases, done, strict=True):
        err = proc.stderr.decode(errors="backslashreplace")
        if (proc.returncode != status or "Traceback" in err or err.count("\n") != 1 or needle not in err
                or proc.stdout):
            wrong.append(f"{argv!r}: exit {proc.returncode} (want {status}), stderr {err!r}, stdout {proc.stdout!r}")
    assert not wrong, "\n".join(wrong)
    assert list(tmp_path.iterdir()) == []  # no demo made a cluster dir: every refusal came before anything was built


def test_every_bad_invocation_is_one_line_with_its_documented_status(tmp_path: Path) -> None:
    run_table(CASES, tmp_path)


@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="run `make model` (default GGUF missing)")
def test_demo_checks_the_model_header_before_building(tmp_path: Path) -> None:
    run_table(MODEL_CASES, tmp_path)


def test_bad_link_conditions_are_refused_by_name(tmp_path: Path) -> None:
    run_table(LINK_CASES, tmp_path)


def test_help_documents_the_exit_statuses() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = swactor(["--help"], tmp)
    assert out.returncode == 0
    text = out.stdout.decode()
    assert "exit status:" in text and "bad invocation" in text and "refused or failed" in text
