"""MemberView: this node's member table, built from engine events; I/O-free.

It keeps every member the engine reported (dead and left ones too, for `departed_retention`),
when each one's liveness last changed, and turns engine events into the watch events of the
API (join / suspect / alive / dead / left / metadata-changed, each with the incarnation).
Time comes in as `now_us`; nothing here sleeps, reads a clock or touches a socket.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from swactor.membership.swim import Liveness, SwimEvent, SwimEventKind, SwimMember


class ViewEventKind(enum.Enum):
    JOIN = "join"
    SUSPECT = "suspect"
    ALIVE = "alive"
    DEAD = "dead"
    LEFT = "left"
    METADATA_CHANGED = "metadata_changed"


@dataclass(frozen=True)
class MemberRecord:
    member: SwimMember
    status_since_us: int
    is_self: bool = False

    @property
    def departed(self) -> bool:
        return self.member.liveness in (Liveness.DEAD, Liveness.LEFT)


@dataclass(frozen=True)
class ViewEvent:
    kind: ViewEventKind
    record: MemberRecord
    time_us: int


@dataclass(frozen=True)
class Counts:
    alive: int
    suspect: int
    dead: int
    left: int


# Engine event -> (liveness after it, watch event kind); UPDATED keeps the liveness it carries.
_TRANSITIONS: dict[SwimEventKind, tuple[Liveness, ViewEventKind]] = {
    SwimEventKind.JOINED: (Liveness.ALIVE, ViewEventKind.JOIN),
    SwimEventKind.SUSPECT: (Liveness.SUSPECT, ViewEventKind.SUSPECT),
    SwimEventKind.RECOVERED: (Liveness.ALIVE, ViewEventKind.ALIVE),
    SwimEventKind.DEAD: (Liveness.DEAD, ViewEventKind.DEAD),
    SwimEventKind.LEFT: (Liveness.LEFT, ViewEventKind.LEFT),
}
_ENTERED: dict[Liveness, ViewEventKind] = {
    Liveness.ALIVE: ViewEventKind.ALIVE,
    Liveness.SUSPECT: ViewEventKind.SUSPECT,
    Liveness.DEAD: ViewEventKind.DEAD,
    Liveness.LEFT: ViewEventKind.LEFT,
}


class MemberView:
    def __init__(self, local: SwimMember, now_us: int, departed_retention_us: int) -> None:
        self._local_name = local.name
        self._retention_us = departed_retention_us
        self._records: dict[str, MemberRecord] = {local.name: MemberRecord(local, now_us, is_self=True)}

    # ---- inputs ----

    def apply(self, event: SwimEvent, now_us: int) -> list[ViewEvent]:
        m = event.member
        if m is None or m.name == self._local_name:
            return []
        old = self._records.get(m.name)
        if event.kind is SwimEventKind.UPDATED:
            if old is None or old.departed:
                return self._set(replace(m, liveness=Liveness.ALIVE), ViewEventKind.JOIN, now_us)
            return self._set(replace(m, liveness=old.member.liveness), ViewEventKind.METADATA_CHANGED, now_us)
        if event.kind is SwimEventKind.RESYNC:
            return []
        liveness, kind = _TRANSITIONS[event.kind]
        return self._set(replace(m, liveness=liveness), kind, now_us)

    def resync(self, current: list[SwimMember], tombstones: list[SwimMember], now_us: int) -> list[ViewEvent]:
        """Catch up after lost events: `current` is the engine's alive+suspect list, `tombstones`
        what it says about members that were live here and are missing from `current`."""
        out: list[ViewEvent] = []
        for m in [*current, *tombstones]:
            if m.name == self._local_name:
                continue
            old = self._records.get(m.name)
            if old is None or (old.departed and m.liveness in (Liveness.ALIVE, Liveness.SUSPECT)):
                out += self._set(m, ViewEventKind.JOIN, now_us)
            elif old.member.liveness is not m.liveness:
                out += self._set(m, _ENTERED[m.liveness], now_us)
            elif dict(old.member.meta) != dict(m.meta):
                out += self._set(m, ViewEventKind.METADATA_CHANGED, now_us)
        return out

    def update_local(self, local: SwimMember, now_us: int) -> list[ViewEvent]:
        old = self._records[self._local_name]
        if dict(old.member.meta) == dict(local.meta) and old.member.incarnation == local.incarnation:
            return []
        rec = MemberRecord(local, old.status_since_us, is_self=True)
        self._records[self._local_name] = rec
        if dict(old.member.meta) == dict(local.meta):
            return []
        return [ViewEvent(ViewEventKind.METADATA_CHANGED, rec, now_us)]

    def expire(self, now_us: int) -> list[str]:
        """Forget dead and left members older than the retention; returns their names."""
        gone = [
            name for name, r in self._records.items()
            if r.departed and now_us - r.status_since_us >= self._retention_us
        ]
        for name in gone:
            del self._records[name]
        return gone

    # ---- reads ----

    def local(self) -> MemberRecord:
        return self._records[self._local_name]

    def get(self, name: str) -> MemberRecord | None:
        return self._records.get(name)

    def records(self, include_departed: bool = False) -> list[MemberRecord]:
        """This node first, then the others by name."""
        others = sorted((r for r in self._records.values() if not r.is_self), key=lambda r: r.member.name)
        if not include_departed:
            others = [r for r in others if not r.departed]
        return [self.local(), *others]

    def counts(self) -> Counts:
        by = [r.member.liveness for r in self._records.values()]
        return Counts(
            alive=by.count(Liveness.ALIVE),
            suspect=by.count(Liveness.SUSPECT),
            dead=by.count(Liveness.DEAD),
            left=by.count(Liveness.LEFT),
        )

    # ---- the one place a record changes ----

    def _set(self, member: SwimMember, kind: ViewEventKind, now_us: int) -> list[ViewEvent]:
        old = self._records.get(member.name)
        if old is not None and old.member == member:
            return []  # already known exactly so (an event that raced the initial read)
        changed = old is None or old.member.liveness is not member.liveness
        since = now_us if changed or old is None else old.status_since_us
        rec = MemberRecord(member, since)
        self._records[member.name] = rec
        return [ViewEvent(kind, rec, now_us)]
