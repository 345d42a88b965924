"""MemberView: engine events in, watch events out; fake time in microseconds, no I/O."""

from __future__ import annotations

from dataclasses import replace

from swactor.membership.swim import Liveness, SwimEvent, SwimEventKind, SwimMember
from swactor.membership.view import MemberView, ViewEventKind

K = SwimEventKind
SELF = SwimMember("1", "10.0.0.1:7946", Liveness.ALIVE, 0, {"id": "1"})


def peer(name: str, inc: int = 0, liveness: Liveness = Liveness.ALIVE, **meta: str) -> SwimMember:
    return SwimMember(name, f"10.0.0.{name}:7946", liveness, inc, {"id": name, **meta})


def view() -> MemberView:
    return MemberView(SELF, now_us=0, departed_retention_us=60_000_000)


def test_lifecycle_of_a_member_and_its_incarnations() -> None:
    v = view()
    steps = [
        (K.JOINED, peer("2"), ViewEventKind.JOIN, Liveness.ALIVE),
        (K.SUSPECT, peer("2"), ViewEventKind.SUSPECT, Liveness.SUSPECT),
        (K.RECOVERED, peer("2", 1), ViewEventKind.ALIVE, Liveness.ALIVE),
        (K.SUSPECT, peer("2", 1), ViewEventKind.SUSPECT, Liveness.SUSPECT),
        (K.DEAD, peer("2", 1), ViewEventKind.DEAD, Liveness.DEAD),
        (K.JOINED, peer("2", 2), ViewEventKind.JOIN, Liveness.ALIVE),
    ]
    for t, (kind, m, expect, liveness) in enumerate(steps, start=1):
        (ev,) = v.apply(SwimEvent(kind, m), now_us=t)
        assert ev.kind is expect and ev.time_us == t
        assert ev.record.member.liveness is liveness
        assert ev.record.status_since_us == t
    rec = v.get("2")
    assert rec is not None and rec.member.incarnation == 2


def test_engine_liveness_is_taken_from_the_event_not_the_member_snapshot() -> None:
    v = view()
    # The member attached to a DEAD event may still say "suspect"; the event decides.
    (ev,) = v.apply(SwimEvent(K.DEAD, peer("2", liveness=Liveness.SUSPECT)), now_us=5)
    assert ev.record.member.liveness is Liveness.DEAD


def test_metadata_update_keeps_liveness_and_status_time() -> None:
    v = view()
    v.apply(SwimEvent(K.JOINED, peer("2")), now_us=1)
    v.apply(SwimEvent(K.SUSPECT, peer("2")), now_us=2)
    (ev,) = v.apply(SwimEvent(K.UPDATED, peer("2", 1, Liveness.ALIVE, st="available")), now_us=3)
    assert ev.kind is ViewEventKind.METADATA_CHANGED
    assert ev.record.member.liveness is Liveness.SUSPECT
    assert ev.record.status_since_us == 2
    assert ev.record.member.meta["st"] == "available"


def test_update_about_an_unknown_member_is_a_join() -> None:
    (ev,) = view().apply(SwimEvent(K.UPDATED, peer("9")), now_us=1)
    assert ev.kind is ViewEventKind.JOIN


def test_events_about_self_and_resync_markers_are_ignored() -> None:
    v = view()
    assert v.apply(SwimEvent(K.DEAD, replace(SELF)), now_us=1) == []
    assert v.apply(SwimEvent(K.RESYNC), now_us=1) == []
    assert v.local().member.liveness is Liveness.ALIVE


def test_departed_are_listed_only_on_request_and_forgotten_after_retention() -> None:
    v = view()
    v.apply(SwimEvent(K.JOINED, peer("2")), now_us=0)
    v.apply(SwimEvent(K.JOINED, peer("3")), now_us=0)
    v.apply(SwimEvent(K.LEFT, peer("2")), now_us=10)
    assert [r.member.name for r in v.records()] == ["1", "3"]
    assert [r.member.name for r in v.records(include_departed=True)] == ["1", "2", "3"]
    assert v.counts().left == 1 and v.counts().alive == 2
    assert v.expire(now_us=10 + 59_999_999) == []
    assert v.expire(now_us=10 + 60_000_000) == ["2"]
    assert v.get("2") is None


def test_resync_diffs_against_the_engine() -> None:
    v = view()
    v.apply(SwimEvent(K.JOINED, peer("2")), now_us=0)
    v.apply(SwimEvent(K.JOINED, peer("3")), now_us=0)
    v.apply(SwimEvent(K.JOINED, peer("4")), now_us=0)
    events = v.resync(
        current=[SELF, peer("2"), peer("3", 1, Liveness.SUSPECT), peer("5")],
        tombstones=[peer("4", 0, Liveness.DEAD)],
        now_us=7,
    )
    assert sorted((e.record.member.name, e.kind) for e in events) == [
        ("3", ViewEventKind.SUSPECT), ("4", ViewEventKind.DEAD), ("5", ViewEventKind.JOIN),
    ]
    assert v.resync([SELF, peer("2", 0, st="available")], [], now_us=8)[0].kind is ViewEventKind.METADATA_CHANGED


def test_local_metadata_change_is_an_event_but_a_bare_incarnation_bump_is_not() -> None:
    v = view()
    assert v.update_local(replace(SELF, incarnation=1), now_us=1) == []
    (ev,) = v.update_local(replace(SELF, incarnation=2, meta={"id": "1", "st": "available"}), now_us=2)
    assert ev.kind is ViewEventKind.METADATA_CHANGED and ev.record.is_self
    assert v.local().member.incarnation == 2


def test_an_event_repeating_what_the_view_already_holds_is_not_reported_twice() -> None:
    v = view()
    v.resync([SELF, peer("2")], [], now_us=1)  # read right after subscribing...
    assert v.apply(SwimEvent(K.JOINED, peer("2")), now_us=2) == []  # ...then the event arrives
    (ev,) = v.apply(SwimEvent(K.JOINED, peer("2", 1)), now_us=3)
    assert ev.kind is ViewEventKind.JOIN and ev.record.member.incarnation == 1
