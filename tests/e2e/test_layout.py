"""The per-host TOML the local cluster writes is accepted by every service's own config loader
(unknown keys or wrong types would be refused by name), so a renamed setting fails here, fast."""

from __future__ import annotations

import tomllib
from pathlib import Path

from swactor.arena.config import ArenaConfig
from swactor.common.config import load_section
from swactor.edge.config import EdgeConfig
from swactor.localcluster.layout import HostLayout, host_config, to_toml
from swactor.membership.config import MembershipConfig
from swactor.orchestrator.config import OrchestratorConfig
from swactor.worker.config import WorkerConfig


def test_host_config_round_trips_through_every_service_loader(tmp_path: Path) -> None:
    h = HostLayout(1, "127.9.9.2", tmp_path / "h1")
    tables = host_config(h, seeds=["127.9.9.1:7946"], secret_file=tmp_path / "s", device="CPU", ceiling_bytes=1 << 30,
                         gpu="CPU:local-1:0", orchestrator={"model_path": "/m.gguf", "pool_window_s": 0.5,
                                                           "readiness_timeout_s": 120.0}, compute_threads=2)
    cfg = tomllib.loads(to_toml(tables))
    arena = load_section(cfg, "arena", ArenaConfig)
    memb = load_section(cfg, "membership", MembershipConfig)
    edge = load_section(cfg, "edge", EdgeConfig)
    worker = load_section(cfg, "worker", WorkerConfig)
    orch = load_section(cfg, "orchestrator", OrchestratorConfig)
    # every service of the host talks to the same sockets and advertises the host's address
    assert arena.socket == worker.arena_socket == edge.arena_socket == orch.arena_socket == h.sock("arena")
    assert memb.socket == edge.membership_socket == worker.membership_socket == orch.membership_socket
    assert edge.socket == worker.edge_socket == orch.edge_socket
    assert edge.wake_socket == worker.edge_wake_socket == orch.edge_wake_socket
    assert memb.edge_endpoint == edge.bind == "127.9.9.2:7400"
    assert memb.control_endpoint == worker.control_address == "127.9.9.2:7441"
    assert memb.seeds == ["127.9.9.1:7946"] and memb.gpu_autodetect is False
    assert arena.state_dir == memb.state_dir == edge.state_dir == worker.state_dir == orch.state_dir
    assert orch.tcp_address == "" and orch.model_path == Path("/m.gguf")
    assert worker.compute_threads == 2 and worker.backend() == {"device": "CPU", "threads": 2,
                                                           "graph_cache": str(worker.graph_cache_path())}
    assert orch.readiness_timeout_s == 120.0


def test_a_host_behind_nat_advertises_every_port_the_mapping_forwards(tmp_path: Path) -> None:
    from swactor.localcluster.nat import MAPPED, PUBLIC_OFFSET, rules

    h = HostLayout(1, "127.9.9.2", tmp_path / "h1")
    cfg = tomllib.loads(to_toml(host_config(h, seeds=["127.9.9.1:17946"], secret_file=tmp_path / "s", device="CPU",
                                            ceiling_bytes=1 << 30, gpu="CPU:local-1:0",
                                            orchestrator={"model_path": "/m.gguf"}, public_offset=PUBLIC_OFFSET)))
    memb, edge = load_section(cfg, "membership", MembershipConfig), load_section(cfg, "edge", EdgeConfig)
    worker, orch = load_section(cfg, "worker", WorkerConfig), load_section(cfg, "orchestrator", OrchestratorConfig)
    advertised = {"membership": memb.advertise, "edge": edge.advertise, "control": worker.advertise_control,
                  "model": orch.model_server_advertise}
    bound = {"membership": memb.bind, "edge": edge.bind, "control": worker.control_address,
             "model": orch.model_server_address}
    assert memb.edge_endpoint == edge.advertise and memb.control_endpoint == worker.advertise_control
    script = rules(h.addr)
    for m in MAPPED:  # each service: bound at its port, advertised at the mapped one, which the table forwards
        assert bound[m.name] == f"127.9.9.2:{m.port}" and advertised[m.name] == f"127.9.9.2:{m.public}"
        for proto in m.protos:
            assert f'iifname "eth0" {proto} dport {m.public} dnat to :{m.port}' in script
            assert f"ip daddr 127.9.9.2 {proto} dport {m.public} dnat to :{m.port}" in script
