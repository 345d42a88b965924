"""The orchestrator's side of model distribution (docs/distribution.md).

For every served model: bring the file here (a URL source is materialised into the model cache),
compute or load its manifest (cached in `<state_dir>/manifests`, keyed by path, size, mtime and
inode), put it on the model server, and hand each stage a `GgufSource` naming the server's URL,
the file's SHA-256 and the manifest digest. Preparation runs once per file version and is shared
by every run that waits for it; its failure faults those runs with the reason (never a hang).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path

from swactor.common.events import get_logger
from swactor.distribution.server import FileTable, ServedFile
from swactor.modelfile.header import GgufFormatError
from swactor.modelfile.manifest import VERSION, Manifest, ManifestError, build_manifest
from swactor.orchestrator.fleet.fleet import FleetError, Report
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.models.models import ModelRegistry, ModelUnusable, load_model
from swactor.orchestrator.models.sources import ModelSource, SourceError
from swactor.orchestrator.planning.planner import RunPlan
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb
from swactor.v1 import stage_pb2

PROGRESS_EVERY_S = 1.0
log = get_logger(component="distributor")


@dataclass(frozen=True)
class Prepared:
    name: str
    path: Path
    manifest: Manifest
    manifest_bytes: bytes
    digest: str
    # The file version the manifest was made from (ManifestCache.version_key).
    version_key: str


class ManifestCache:
    """Manifests by (path, size, mtime, inode, piece size): a file is hashed once per version."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def version_key(self, path: Path, piece_bytes: int) -> str:
        st = os.stat(path)
        ident = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_dev}|{piece_bytes}|v{VERSION}"
        return hashlib.sha256(ident.encode()).hexdigest()

    def get(self, source: ModelSource, path: Path, piece_bytes: int) -> tuple[Manifest, bytes]:
        key = self.version_key(path, piece_bytes)
        cached = self.root / f"{key}.json"
        try:
            raw = cached.read_bytes()
            m = Manifest.decode(raw)
            if m.size == os.stat(path).st_size:
                return m, raw
        except (OSError, ManifestError):
            pass
        header, _ = ModelSource(source.name, str(path)).read_header()
        m = build_manifest(path, header, piece_bytes or None)
        raw = m.encode()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_bytes(raw)
        os.replace(tmp, cached)
        return m, raw


@dataclass(eq=False)
class Distributor:
    registry: ModelRegistry
    files: FileTable
    _: KW_ONLY
    state_dir: InitVar[Path]  # manifests are cached under its "manifests"
    cache_dir: Path
    node_id: int
    server_port: int
    advertise: str = ""
    piece_bytes: int = 0
    members: Callable[[], tuple[NodeInfo, ...]] = tuple
    node_paths: dict[str, Path] = field(default_factory=dict)
    stall_timeout_s: float = 30.0
    # A URL source's stages fetch their pieces from the URL itself (GgufSource.source_url), the model server
    # being their fallback: the orchestrator's uplink then carries one copy, not one per stage host.
    stages_fetch_from_source: bool = True
    manifests: ManifestCache = field(init=False)
    _tasks: dict[str, asyncio.Task[Prepared]] = field(default_factory=dict, init=False)
    _listeners: dict[str, set[Callable[[pb.LifecycleEvent], None]]] = field(default_factory=dict, init=False)
    state: dict[str, tuple[str, str]] = field(default_factory=dict, init=False)  # name -> (state, detail) for ListModels

    def __post_init__(self, state_dir: Path) -> None:
        self.manifests = ManifestCache(state_dir / "manifests")

    # ---- preparing a file ----

    def start(self, name: str) -> asyncio.Task[Prepared]:
        """The (shared) preparation of `name`; a finished one is re-used while the local file is unchanged."""
        task = self._tasks.get(name)
        if task is not None and task.done() and (task.cancelled() or task.exception() is not None or self._stale(name, task)):
            task = None
        if task is None:
            task = asyncio.create_task(self._prepare(name), name=f"prepare-{name}")
            self._tasks[name] = task
        return task

    def _stale(self, name: str, task: asyncio.Task[Prepared]) -> bool:
        src = self.registry.sources[name]
        prepared = task.result()
        if src.is_url:
            return not prepared.path.exists()
        try:
            return self.manifests.version_key(prepared.path, self.piece_bytes) != prepared.version_key
        except OSError:
            return True

    def prepared(self, name: str) -> Prepared | None:
        """The finished, successful preparation of `name`, if any."""
        task = self._tasks.get(name)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    async def _prepare(self, name: str) -> Prepared:
        src = self.registry.sources[name]
        self.state[name] = ("preparing", "")
        try:
            path = src.path
            if src.is_url:
                path = await self._materialise(src)
            m, raw = await asyncio.to_thread(self.manifests.get, src, path, self.piece_bytes)
            if src.sha256 and m.file_sha256 != src.sha256:
                raise SourceError("ChecksumMismatch", f"{path}: sha256 {m.file_sha256} != configured {src.sha256}")
            if src.is_url:  # the copy is what runs: judge it, not only the header the URL first gave
                await asyncio.to_thread(load_model, ModelSource(name, str(path)))
        except (SourceError, ManifestError, GgufFormatError, ModelUnusable, OSError) as e:
            detail = e.detail if isinstance(e, SourceError) else str(e)
            self.state[name] = ("failed", detail)
            log.error("model_prepare_failed", model=name, detail=detail)
            raise
        prepared = Prepared(name, path, m, raw, m.digest(), self.manifests.version_key(path, self.piece_bytes))
        self.files.replace_path(ServedFile(m.file_sha256, path, m.size, raw))
        self.state[name] = ("ready", "")
        log.info("model_served", model=name, sha256=m.file_sha256, size=m.size, pieces=len(m.pieces))
        return prepared

    async def _materialise(self, src: ModelSource) -> Path:
        loop = asyncio.get_running_loop()
        t0, last = time.monotonic(), [0.0]
        self._emit(src.name, pb.WEIGHTS_DOWNLOAD_STARTED, {}, f"orchestrator: fetching {src.location}")

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_EVERY_S and done < total:
                return
            last[0] = now
            rate = done / max(1e-6, now - t0)
            counters = {"bytes_done": done, "bytes_total": total, "rate_bps": int(rate),
                        "eta_ms": int((total - done) / rate * 1000) if rate > 0 else -1}
            loop.call_soon_threadsafe(self._emit, src.name, pb.WEIGHTS_DOWNLOAD_PROGRESS, counters,
                                      f"orchestrator: fetching {src.location}")

        path = await asyncio.to_thread(src.materialise, self.cache_dir, progress, self.stall_timeout_s)
        self._emit(src.name, pb.WEIGHTS_DOWNLOADED, {"bytes_total": path.stat().st_size},
                   f"orchestrator: {src.location} is in {path}")
        return path

    def _emit(self, name: str, kind: int, counters: dict[str, int], detail: str) -> None:
        for listener in list(self._listeners.get(name, ())):
            ev = pb.LifecycleEvent(kind=kind, node_id=self.node_id, component=pb.COMPONENT_ORCHESTRATOR, detail=detail)
            for k, v in counters.items():
                ev.counters[k] = int(v)
            listener(ev)

    # ---- what a stage is sent ----

    async def gguf_source(self, plan: RunPlan, report: Report) -> stage_pb2.GgufSource:
        name = plan.model.model_id

        def relay(ev: pb.LifecycleEvent) -> None:
            ev.run_id = plan.run_id
            report(F.Relay(ev))

        listeners = self._listeners.setdefault(name, set())
        listeners.add(relay)
        try:
            prepared = await asyncio.shield(self.start(name))
        except (SourceError, ManifestError, GgufFormatError, OSError) as e:
            detail = e.detail if isinstance(e, SourceError) else str(e)
            reason = e.reason if isinstance(e, SourceError) else type(e).__name__
            raise FleetError(pb.RUN_FAULT_WEIGHTS_LOAD_FAILED,
                             f"the orchestrator cannot serve model {name!r}: {reason}: {detail}") from None
        except ModelUnusable as e:
            raise FleetError(pb.RUN_FAULT_MODEL_REFUSED, str(e)) from None
        finally:
            listeners.discard(relay)
        m = prepared.manifest
        if name in self.node_paths:  # the operator put the file on every node: send the path, checked by hash
            return stage_pb2.GgufSource(path=str(self.node_paths[name]), sha256=m.file_sha256)
        src = self.registry.sources[name]
        return stage_pb2.GgufSource(url=f"https://{self.server_address()}/v1/files/{m.file_sha256}",
                                    sha256=m.file_sha256, manifest_sha256=prepared.digest, size=m.size,
                                    source_url=src.location if src.is_url and self.stages_fetch_from_source else "")

    def server_address(self) -> str:
        """host:port stage hosts reach the model server at: configured, else this node's control host."""
        if self.advertise:
            return self.advertise
        me = next((n for n in self.members() if n.node_id == self.node_id), None)
        host = (me.control_endpoint or me.edge_endpoint).rpartition(":")[0] if me is not None else ""
        if not host or host in ("0.0.0.0", "[::]"):
            raise FleetError(pb.RUN_FAULT_WEIGHTS_LOAD_FAILED,
                             f"the orchestrator's node {self.node_id} has no reachable address in the membership "
                             "view; set [orchestrator].model_server_advertise")
        return f"{host}:{self.server_port}"
