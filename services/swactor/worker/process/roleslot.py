"""The compute process's role and its loads (spec §29 ConfigureRole, §15 warm reuse): part of the core.

One role is resident at a time. A ConfigureRole naming the resident weights (`roles.weights_key`)
resets that role's KV slot `config.slot` (ResetRole, answered `RoleConfigured{warm}`); any other drops
it and loads a new one on a loader thread (StartLoad; progress, then LoadDone / LoadFailed come back as
inputs). Runs in flight share the resident role: each run's role id is bound to its slot, and a step of
any bound role id runs on it (docs/runs-in-flight.md). A ConfigureRole of the weights being loaded joins
that load (answered warm once it is done, or failed with it); one of other weights cancels the load and
waits for it to end (so no two sets of weights are ever resident), a third one supersedes the waiting
second. CancelRole abandons a load (or the waiting config, or a joiner); a configured role stays
resident. Like the rest of the core: no thread, no role call here, only actions through `do`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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
    key: tuple[Any, ...]
    slot: int
    cancel: tuple[int, str] | None = None  # (RoleFailure, detail) once abandoned: reported when it ends
    last_progress: tuple[str, int, int] | None = None
    joiners: list[wire.ConfigureRole] = field(default_factory=list)  # runs of the same weights: reset once it loaded
    lead_cancelled: bool = False  # the run that started the load was cancelled (answered): the joiners still wait

    def waiting(self) -> list[int]:
        """The role ids still waiting for this load: its lead unless cancelled, then the joiners."""
        return ([] if self.lead_cancelled else [self.role_id]) + [j.role_id for j in self.joiners]


class RoleSlot:
    def __init__(self, do: Callable[[m.Action], None], log: Any) -> None:
        self._do = do
        self.log = log
        self.threads: int | None = None  # backend.threads: CPU cores of the compute kernels (None: auto)
        self.graph_cache = ""  # backend.graph_cache: where compiled graphs are kept ("" = nowhere)
        self.role: Any = None
        self.bound: dict[int, int] = {}  # KV slot -> the role id of the run configured in it (runs in flight)
        self.loading: Loading | None = None
        self.pending: wire.ConfigureRole | None = None  # the next load, once the cancelled one has ended
        self.resetting: dict[int, int] = {}  # role id -> the slot its ResetRole is for

    def _emit(self, event: wire.Event) -> None:
        self._do(m.Emit(event))

    def ready(self, role_id: int) -> bool:
        return self.role is not None and role_id in self.bound.values()

    def configure(self, cmd: wire.ConfigureRole) -> None:
        ld = self.loading
        if ld is not None and ld.cancel is None and self.pending is None and ld.key == weights_key(cmd.config):
            ld.joiners.append(cmd)  # another run of the weights being loaded: it waits for them
            return
        if ld is not None:  # a config of other weights wins: the load in flight is abandoned first
            self._cancel_load(pb.ROLE_FAILURE_LOAD_CANCELLED, f"superseded by ConfigureRole {cmd.role_id}")
            if self.pending is not None:
                self._emit(wire.RoleFailed(self.pending.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED,
                                           f"superseded by ConfigureRole {cmd.role_id}"))
            self.pending = cmd
            return
        self._start(cmd)

    def _start(self, cmd: wire.ConfigureRole) -> None:
        key = weights_key(cmd.config)
        if self.role is not None and getattr(self.role, "key", None) == key:
            self._reset(cmd)
            return
        # Cold: drop the resident role first (its device memory and every run bound to it), then load on the loader thread.
        self.role = None
        self.bound.clear()
        self.loading = Loading(cmd.role_id, key, config_slot(cmd.config))
        self.log.info("role_load_started", role_id=cmd.role_id, threads=self.threads or 0)
        self._do(m.StartLoad(cmd.role_id, cmd.config, self.threads, self.graph_cache))

    def _cancel_load(self, reason: int, detail: str) -> None:
        assert self.loading is not None
        if self.loading.cancel is None:
            self.loading.cancel = (reason, detail)
            self._do(m.CancelLoad(self.loading.role_id))

    def _reset(self, cmd: wire.ConfigureRole) -> None:
        slot = config_slot(cmd.config)
        self.bound.pop(slot, None)  # the run that held the slot before is gone from it; bound again once reset
        self.resetting[cmd.role_id] = slot
        self._do(m.ResetRole(cmd.role_id, self.role, cmd.config))

    def cancel(self, cmd: wire.CancelRole) -> None:
        joiner = next((j for j in self.loading.joiners if j.role_id == cmd.role_id), None) if self.loading else None
        if joiner is not None:
            assert self.loading is not None
            self.loading.joiners.remove(joiner)
            self._emit(wire.RoleFailed(cmd.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole while the weights load"))
        elif self.pending is not None and self.pending.role_id == cmd.role_id:
            self.pending = None
            self._emit(wire.RoleFailed(cmd.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole before its load started"))
        elif self.loading is not None and self.loading.role_id == cmd.role_id and self.loading.joiners:
            # other runs wait for these weights: the load goes on for them, this run alone is answered cancelled
            self.loading.lead_cancelled = True
            self._emit(wire.RoleFailed(cmd.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole"))
        elif self.loading is not None and self.loading.role_id == cmd.role_id:
            self._cancel_load(pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole")
        else:
            self.log.info("cancel_role_ignored", role_id=cmd.role_id, loaded=cmd.role_id in self.bound.values())

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
            for role_id in ld.waiting():
                self._emit(wire.RoleFailed(role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN,
                                           f"ShutdownWorker {mode} during the load"))

    def reset_done(self, r: m.RoleReset) -> None:
        slot = self.resetting.pop(r.role_id, None)
        if r.reason is not None or slot is None:  # the weights stay resident: a later config may still reuse them
            self._emit(wire.RoleFailed(r.role_id, r.reason or pb.ROLE_FAILURE_LOAD_CANCELLED,
                                       r.detail or "the resident role was dropped during the reset"))
            return
        self.bound[slot] = r.role_id
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
            self.role = r.role
            self.bound = {} if ld.lead_cancelled else {ld.slot: r.role_id}
            self.log.info("role_loaded", role_id=r.role_id, joiners=len(ld.joiners))
            if not ld.lead_cancelled:
                self._emit(wire.RoleConfigured(r.role_id, False))
            for joiner in ld.joiners:  # the other runs of these weights: each resets its own slot
                self._reset(joiner)
        else:  # cancelled: a role that finished anyway is dropped here (its weights with it)
            reason, detail = ld.cancel or (r.reason, r.detail)  # type: ignore[union-attr]
            self.log.info("role_load_ended", role_id=r.role_id, reason=name(pb.RoleFailure, reason), detail=detail)
            for role_id in ld.waiting():
                self._emit(wire.RoleFailed(role_id, reason, detail))
        if self.pending is not None:
            cmd, self.pending = self.pending, None
            self._start(cmd)


def config_slot(config: dict[str, Any]) -> int:
    """The run's KV slot in a ConfigureRole config (the role checks it against its slots; 0 when absent)."""
    slot = config.get("slot", 0)
    return slot if isinstance(slot, int) and not isinstance(slot, bool) else -1
