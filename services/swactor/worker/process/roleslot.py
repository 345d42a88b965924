"""The compute process's role and its loads (spec §29 ConfigureRole, §15 warm reuse): part of the core.

One role is resident at a time. A ConfigureRole naming the resident weights (`roles.weights_key`)
resets that role (ResetRole, answered `RoleConfigured{warm}`); any other drops it and loads a new
one on a loader thread (StartLoad; progress, then LoadDone / LoadFailed come back as inputs). A
newer ConfigureRole while one loads cancels the load and waits for it to end (so no two sets of
weights are ever resident), a third one supersedes the waiting second. CancelRole abandons a load
(or the waiting config); a configured role stays resident. Like the rest of the core: no thread,
no role call here, only actions through `do`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.reasons import name
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import messages as m
from swactor.worker.process import wire
from swactor.worker.process.roles import weights_key


@dataclass
class Loading:
    """The cold load in flight (its thread lives in the shell)."""

    role_id: int
    cancel: tuple[int, str] | None = None  # (RoleFailure, detail) once abandoned: reported when it ends
    last_progress: tuple[str, int, int] | None = None


class RoleSlot:
    def __init__(self, do: Callable[[m.Action], None], log: Any) -> None:
        self._do = do
        self.log = log
        self.threads: int | None = None  # backend.threads: CPU cores of the compute kernels (None: auto)
        self.graph_cache = ""  # backend.graph_cache: where compiled graphs are kept ("" = nowhere)
        self.role: Any = None
        self.role_id: int | None = None  # the configured role (None while loading, resetting or failed)
        self.loading: Loading | None = None
        self.pending: wire.ConfigureRole | None = None  # the next load, once the cancelled one has ended

    def _emit(self, event: wire.Event) -> None:
        self._do(m.Emit(event))

    def ready(self, role_id: int) -> bool:
        return self.role is not None and self.role_id == role_id

    def configure(self, cmd: wire.ConfigureRole) -> None:
        if self.loading is not None:  # a newer config wins: the load in flight is abandoned first
            self._cancel_load(pb.ROLE_FAILURE_LOAD_CANCELLED, f"superseded by ConfigureRole {cmd.role_id}")
            if self.pending is not None:
                self._emit(wire.RoleFailed(self.pending.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED,
                                           f"superseded by ConfigureRole {cmd.role_id}"))
            self.pending = cmd
            return
        self._start(cmd)

    def _start(self, cmd: wire.ConfigureRole) -> None:
        if self.role is not None and getattr(self.role, "key", None) == weights_key(cmd.config):
            self.role_id = None  # until the reset succeeded
            self._do(m.ResetRole(cmd.role_id, self.role, cmd.config))
            return
        # Cold: drop the resident role first (its device memory), then load on the loader thread.
        self.role, self.role_id = None, None
        self.loading = Loading(cmd.role_id)
        self.log.info("role_load_started", role_id=cmd.role_id, threads=self.threads or 0)
        self._do(m.StartLoad(cmd.role_id, cmd.config, self.threads, self.graph_cache))

    def _cancel_load(self, reason: int, detail: str) -> None:
        assert self.loading is not None
        if self.loading.cancel is None:
            self.loading.cancel = (reason, detail)
            self._do(m.CancelLoad(self.loading.role_id))

    def cancel(self, cmd: wire.CancelRole) -> None:
        if self.pending is not None and self.pending.role_id == cmd.role_id:
            self.pending = None
            self._emit(wire.RoleFailed(cmd.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole before its load started"))
        elif self.loading is not None and self.loading.role_id == cmd.role_id:
            self._cancel_load(pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole")
        else:
            self.log.info("cancel_role_ignored", role_id=cmd.role_id, loaded=cmd.role_id == self.role_id)

    def shutdown(self, mode: str) -> None:
        """ShutdownWorker: the waiting config and the load in flight fail now; the load is not waited for."""
        if self.pending is not None:
            self._emit(wire.RoleFailed(self.pending.role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN,
                                       "ShutdownWorker before its load"))
            self.pending = None
        if self.loading is not None:
            ld, self.loading = self.loading, None
            if ld.cancel is None:
                self._do(m.CancelLoad(ld.role_id))
            self._emit(wire.RoleFailed(ld.role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN,
                                       f"ShutdownWorker {mode} during the load"))

    def reset_done(self, r: m.RoleReset) -> None:
        if r.reason is not None:  # the weights stay resident, unconfigured: a later config may still reuse them
            self._emit(wire.RoleFailed(r.role_id, r.reason, r.detail))
            return
        self.role_id = r.role_id
        self._emit(wire.RoleConfigured(r.role_id, True))

    def progress(self, p: m.LoadProgress) -> None:
        ld = self.loading
        if ld is None or ld.role_id != p.role_id or ld.cancel is not None:
            return
        if ld.last_progress != (p.phase, p.done, p.total):  # one event per layer / graph call
            ld.last_progress = (p.phase, p.done, p.total)
            self._emit(wire.RoleProgress(p.role_id, p.done, p.total, p.phase))

    def ended(self, r: m.LoadDone | m.LoadFailed) -> None:
        ld = self.loading
        if ld is None or ld.role_id != r.role_id:  # a load ShutdownWorker abandoned: its role is dropped
            self.log.info("role_load_dropped", role_id=r.role_id)
            return
        self.loading = None
        if isinstance(r, m.LoadDone) and ld.cancel is None:
            self.role, self.role_id = r.role, r.role_id
            self.log.info("role_loaded", role_id=r.role_id)
            self._emit(wire.RoleConfigured(r.role_id, False))
        else:  # cancelled: a role that finished anyway is dropped here (its weights with it)
            reason, detail = ld.cancel or (r.reason, r.detail)  # type: ignore[union-attr]
            self.log.info("role_load_ended", role_id=r.role_id, reason=name(pb.RoleFailure, reason), detail=detail)
            self._emit(wire.RoleFailed(r.role_id, reason, detail))
        if self.pending is not None:
            cmd, self.pending = self.pending, None
            self._start(cmd)
