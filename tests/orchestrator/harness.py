"""An in-process orchestrator gRPC server (real grpc.aio on a temp Unix socket and, given API access, a
TLS TCP port with the bearer-token check), built by the service's own `listeners()`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from swactor.common.grpcio import set_serving, unix_target
from swactor.orchestrator.api.api_access import ApiAccess
from swactor.orchestrator.api.server import listeners
from swactor.orchestrator.api.service import SERVICE_NAME, OrchestratorServicer
from swactor.orchestrator.config import DEFAULT_MODEL_NAME, OrchestratorConfig
from swactor.orchestrator.models.models import ModelRegistry
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.manager import Limits, Orchestrator
from swactor.orchestrator.runs.store import RunStore
from swactor.orchestrator.tokens.draft_model import DraftModel
from swactor.v1 import orchestrator_pb2_grpc

from .helpers import MODEL_PATH

_REGISTRIES: dict[tuple[str, ...], ModelRegistry] = {}


def registry(*names: str) -> ModelRegistry:
    """The default model under each of `names` (the first is the default; none: its own name), one registry per names
    and test process: the GGUF metadata is read once."""
    names = names or (DEFAULT_MODEL_NAME,)
    if not MODEL_PATH.exists():
        pytest.skip(f"{MODEL_PATH} missing: run `make model`")
    if names not in _REGISTRIES:
        _REGISTRIES[names] = ModelRegistry(dict.fromkeys(names, MODEL_PATH), names[0])
    return _REGISTRIES[names]


@dataclass
class Served:
    orch: Orchestrator
    stub: orchestrator_pb2_grpc.OrchestratorStub
    socket: Path
    tcp_port: int
    store: RunStore


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, fleet, members=(), timeouts: F.Timeouts | None = None,
                  store: RunStore | None = None, max_seq_len_cap: int = 4096,
                  access: ApiAccess | None = None, limits: Limits | None = None,
                  kv_dtype: str = "float32", max_slots_per_stage: int = 1,
                  draft_model: DraftModel | None = None) -> AsyncIterator[Served]:
    store = store or RunStore.in_state_dir(tmp_path / "state")
    cfg = F.FsmConfig(orchestrator_node_id=900, pool_window_s=0.05, timeouts=timeouts or F.Timeouts(teardown_s=2.0),
                      max_seq_len_cap=max_seq_len_cap, kv_dtype=kv_dtype, max_slots_per_stage=max_slots_per_stage)
    orch = Orchestrator(models=registry(), fleet=fleet, store=store, fsm_config=cfg, limits=limits or Limits(),
                        draft_model=draft_model)
    orch.set_members(tuple(members))
    sock = tmp_path / "orchestrator.sock"
    cfg = OrchestratorConfig(socket=sock, tcp_address="127.0.0.1:0" if access else "")
    servers, port = listeners(cfg, access, OrchestratorServicer(orch))
    for server, health in servers:
        await server.start()
        await set_serving(health, [SERVICE_NAME])
    channel = grpc.aio.insecure_channel(unix_target(sock))
    try:
        yield Served(orch, orchestrator_pb2_grpc.OrchestratorStub(channel), sock, port or 0, store)
    finally:
        await channel.close()
        await orch.shutdown()
        for server, _ in servers:
            await server.stop(grace=0.5)
