"""The real `swactor-orchestrator` process: startup, restart recovery, refusals, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swactor.orchestrator.runs.store import ORCHESTRATOR_RESTARTED, RunStore
from swactor.v1 import orchestrator_pb2 as opb

from .helpers import MODEL_PATH

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(not MODEL_PATH.exists(), reason=f"{MODEL_PATH} missing: run `make model`")]


def cli(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swactor.cli.main", "--address", f"unix:{sock}", *args],
                          capture_output=True, text=True, timeout=30)


def test_process_recovers_interrupted_runs_refuses_without_pool_and_stops_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = RunStore.in_state_dir(state)
    store.put(opb.Run(run_id=77, model="smollm2-135m-instruct", state=opb.RUN_STATE_RUNNING, created_us=1))
    store.close()
    sock = tmp_path / "orch.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "swactor.orchestrator.main", "--socket", str(sock), "--state-dir", str(state),
         "--membership-socket", str(tmp_path / "no-membership.sock"), "--model", str(MODEL_PATH)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": ""})
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "orchestrator did not start"
            time.sleep(0.1)
        shown = cli(sock, "show", "77", "--json")
        assert shown.returncode == 0, shown.stderr
        assert ORCHESTRATOR_RESTARTED in shown.stdout and "RUN_OUTCOME_FAULTED" in shown.stdout
        events = cli(sock, "events", "77")
        assert f"run_faulted reason={ORCHESTRATOR_RESTARTED}" in events.stdout
        nodes = cli(sock, "nodes")
        assert nodes.returncode == 0 and "pool not ready: no membership view yet" in nodes.stdout
        refused = cli(sock, "submit", "--prompt", "hi")
        assert refused.returncode == 1 and "need 1 stage device(s); the pool has 0 on 0 Available node(s)" in refused.stderr
        bad_model = cli(sock, "submit", "--prompt", "hi", "--model", "nope")
        assert bad_model.returncode == 1 and "unknown model 'nope'" in bad_model.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, err
    assert '"run_interrupted_by_restart"' in err and '"orchestrator_serving"' in err
    assert '"membership_unreachable"' in err
    assert '"fleet": "NoSecretFleet"' in err  # no cluster secret: provisioning refuses by name
    assert '"tcp_port": null' in err  # the TCP API is off unless configured: the Unix socket only


def test_bad_config_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "swactor.toml"
    cfg.write_text("[orchestrator]\npool_windw_s = 3\n")
    r = subprocess.run([sys.executable, "-m", "swactor.orchestrator.main", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown key(s) pool_windw_s" in r.stderr
    for line, needle in [("queue_depth = -1", "[orchestrator].queue_depth must be >= 0, got -1"),
                         ("max_request_bytes = 0", "[orchestrator].max_request_bytes must be positive, got 0"),
                         ("runs_max_age_s = -5.0", "[orchestrator].runs_max_age_s must be >= 0"),
                         ("readiness_min_fetch_bps = -1", "[orchestrator].readiness_min_fetch_bps must be >= 0"),
                         ("prefill_chunk = 4096", "[orchestrator].prefill_chunk must be 0..1024"),
                         ("max_slots_per_stage = 0", "[orchestrator].max_slots_per_stage must be 1..64"),
                         ('kv_dtype = "bfloat16"', "[orchestrator].kv_dtype must be one of 'float32', 'float16'"),
                         ("draft_slots = 0", "[orchestrator].draft_slots must be 1..64"),
                         ('draft_model = "small.gguf"', "[orchestrator].draft_model must be an absolute path")]:
        cfg.write_text(f"[orchestrator]\n{line}\n")
        r = subprocess.run([sys.executable, "-m", "swactor.orchestrator.main", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "swactor.orchestrator.main", "--socket", str(tmp_path / "s.sock"),
                        "--tcp", "", "--state-dir", str(tmp_path), "--model", str(tmp_path / "missing.gguf")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "missing.gguf does not exist" in r.stderr
    r = subprocess.run([sys.executable, "-m", "swactor.orchestrator.main", "--socket", str(tmp_path / "s.sock"),
                        "--tcp", "", "--state-dir", str(tmp_path), "--model", str(MODEL_PATH),
                        "--secret-file", str(tmp_path / "nope.secret")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "nope.secret does not exist" in r.stderr
    cfg.write_text(f'[orchestrator]\ndraft_model = "{tmp_path / "draft.gguf"}"\n')
    r = subprocess.run([sys.executable, "-m", "swactor.orchestrator.main", "--config", str(cfg), "--socket",
                        str(tmp_path / "s.sock"), "--tcp", "", "--state-dir", str(tmp_path), "--model", str(MODEL_PATH)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and f"draft model: MissingFile: model file {tmp_path / 'draft.gguf'} does not exist" in r.stderr


# The orchestrator as systemd's MemoryDenyWriteExecute=yes starts it (prctl PR_SET_MDWE, Linux 6.3+; exit 77 without).
UNDER_MDWE = ("import ctypes, runpy, sys\n"
              "if ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0:\n    sys.exit(77)\n"
              "runpy.run_module('swactor.orchestrator.main', run_name='__main__')")


@pytest.mark.parametrize("kernels", ["cached", "to compile"])
def test_a_draft_model_where_no_kernel_may_run_is_refused_naming_the_unit_s_setting(tmp_path: Path, kernels: str) -> None:
    """tinygrad fails there in two ways: no usable device (its kernels cached), or a PermissionError (compiling)."""
    env = dict(os.environ, **({"XDG_CACHE_HOME": str(tmp_path / "cache")} if kernels == "to compile" else {}))
    cfg = tmp_path / "swactor.toml"
    cfg.write_text(f'[orchestrator]\ndraft_model = "{MODEL_PATH.resolve()}"\n')
    r = subprocess.run([sys.executable, "-c", UNDER_MDWE, "--config", str(cfg), "--socket", str(tmp_path / "s.sock"),
                        "--tcp", "", "--state-dir", str(tmp_path), "--model", str(MODEL_PATH)],
                       capture_output=True, text=True, timeout=120, env=env)
    if r.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE")
    assert r.returncode == 2, r.stderr
    assert f"swactor-orchestrator: draft model {MODEL_PATH.resolve()}: " in r.stderr
    assert "may not map writable and executable memory" in r.stderr and "MemoryDenyWriteExecute=yes" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("slots", [0, -1, 65])
def test_max_slots_per_stage_out_of_range_is_refused_by_name(slots: int) -> None:
    from swactor.common.config import ConfigError
    from swactor.orchestrator.config import OrchestratorConfig
    from swactor.orchestrator.main import fsm_config, limits

    with pytest.raises(ConfigError, match=rf"\[orchestrator\]\.max_slots_per_stage must be 1\.\.64 .*got {slots}$"):
        limits(OrchestratorConfig(max_slots_per_stage=slots))
    limits(OrchestratorConfig(max_slots_per_stage=64))
    assert fsm_config(OrchestratorConfig(max_slots_per_stage=3), 5).max_slots_per_stage == 3
    assert fsm_config(OrchestratorConfig(), 5).max_slots_per_stage == 8


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp16", "", "Float16"])
def test_kv_dtype_other_than_float32_or_float16_is_refused_by_name(kv_dtype: str) -> None:
    from swactor.common.config import ConfigError
    from swactor.orchestrator.config import OrchestratorConfig
    from swactor.orchestrator.main import fsm_config, limits

    with pytest.raises(ConfigError, match=r"\[orchestrator\]\.kv_dtype must be one of 'float32', 'float16' .*got "
                                          rf"'{kv_dtype}'$"):
        limits(OrchestratorConfig(kv_dtype=kv_dtype))
    limits(OrchestratorConfig(kv_dtype="float16"))
    assert fsm_config(OrchestratorConfig(kv_dtype="float16"), 5).kv_dtype == "float16"
    assert fsm_config(OrchestratorConfig(), 5).kv_dtype == "float32"


def test_fleet_choice_follows_the_secret(tmp_path: Path) -> None:
    from swactor.orchestrator.config import OrchestratorConfig
    from swactor.orchestrator.fleet.stage_fleet import StageControlFleet
    from swactor.orchestrator.main import NoSecretFleet, build_fleet
    from swactor.orchestrator.models.models import ModelRegistry

    models = ModelRegistry({"m": MODEL_PATH}, "m")
    assert isinstance(build_fleet(OrchestratorConfig(model_name="m"), 5, models), NoSecretFleet)
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"a cluster secret of 32 bytes...!")
    fleet = build_fleet(OrchestratorConfig(model_name="m", secret_file=secret), 5, models)
    assert isinstance(fleet, StageControlFleet)
    from swactor.orchestrator.tokens.token_endpoints import RingEndpointFactory

    assert isinstance(fleet._endpoints, RingEndpointFactory)  # token endpoints on the local arena + edge-driver
    secret.write_bytes(b"short")
    with pytest.raises(ValueError, match="at least 16"):
        build_fleet(OrchestratorConfig(model_name="m", secret_file=secret), 5, models)
