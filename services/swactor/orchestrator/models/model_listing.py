"""`ListModels` (`swactor models`): the served models, and what every node's weights cache holds.

Nodes are asked over the node control API (StageControl.ListWeights, mutual TLS); a node that does
not answer within the timeout is listed with the error, never waited on longer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.models.distributor import Distributor
from swactor.orchestrator.models.models import ModelRegistry
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import stage_pb2, stage_pb2_grpc

NodeChannel = Callable[[NodeInfo], grpc.aio.Channel]


def served_models(registry: ModelRegistry, distributor: Distributor | None) -> list[opb.ServedModel]:
    out = []
    for name, src in sorted(registry.sources.items()):
        m = opb.ServedModel(name=name, source=src.describe(), is_default=name == registry.default, state="unjudged")
        loaded = registry.loaded(name)
        if loaded is not None:
            m.state, m.architecture, m.num_layers = "judged", loaded.facts.architecture, loaded.facts.num_layers
            m.size = loaded.size
        if distributor is not None:
            state, detail = distributor.state.get(name, ("", ""))
            m.state, m.detail = state or m.state, detail
            p = distributor.prepared(name)
            if p is not None:
                m.sha256, m.size = p.manifest.file_sha256, p.manifest.size
                try:
                    m.url = f"https://{distributor.server_address()}/v1/files/{p.manifest.file_sha256}"
                except FleetError as e:  # no advertised address yet: say so instead of a URL
                    m.detail = m.detail or e.detail
        out.append(m)
    return out


async def node_weights(node: NodeInfo, channel: NodeChannel, names: dict[str, str], timeout_s: float) -> opb.NodeWeights:
    out = opb.NodeWeights(node_id=node.node_id)
    ch = channel(node)
    try:
        resp = await stage_pb2_grpc.StageControlStub(ch).ListWeights(stage_pb2.ListWeightsRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as e:
        out.error = f"{e.code().name}: {e.details()}"
        return out
    finally:
        await ch.close()
    out.limit_bytes, out.used_bytes = resp.limit_bytes, resp.used_bytes
    for f in resp.files:
        out.files.add(sha256=f.sha256, model=names.get(f.sha256, ""), size=f.size, bytes_held=f.bytes_held,
                      pieces_held=f.pieces_held, pieces_total=f.pieces_total, last_used_us=f.last_used_us,
                      in_use=f.in_use, bytes_fetching=f.bytes_fetching)
    return out


async def list_models(registry: ModelRegistry, distributor: Distributor | None, members: tuple[NodeInfo, ...],
                      channel: NodeChannel | None, timeout_s: float = 5.0) -> opb.ListModelsResponse:
    models = served_models(registry, distributor)
    resp = opb.ListModelsResponse(models=models)
    if channel is None:
        return resp
    names = {m.sha256: m.name for m in models if m.sha256}
    nodes = [n for n in sorted(members, key=lambda n: n.node_id) if n.control_endpoint]
    resp.nodes.extend(await asyncio.gather(*(node_weights(n, channel, names, timeout_s) for n in nodes)))
    return resp
