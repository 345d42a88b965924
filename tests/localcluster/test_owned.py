"""What the reaper removes, decided from the owner's records alone: every record kind, the refusals that keep it
from signalling or deleting something that was never the owner's, and nothing at all after a clean teardown."""

from __future__ import annotations

from functools import reduce

import pytest

from swactor.localcluster.owned import (
    DIR,
    DONE,
    GROUP,
    NETNS,
    RELEASE,
    Cleanup,
    Owned,
    apply,
    cleanup,
    record,
)


def fold(*records: bytes) -> Owned:
    return reduce(lambda o, r: apply(o, r.decode()), records, Owned())


def test_records_round_trip_through_the_fold() -> None:
    owned = fold(record(GROUP, 101), record(GROUP, 102), record(NETNS, "swl7-ab12"), record(DIR, "/tmp/swl-x"))
    assert owned == Owned(groups=frozenset({101, 102}), netns=("swl7-ab12",), dirs=("/tmp/swl-x",))


def test_owner_death_removes_every_group_namespace_and_dir_it_recorded() -> None:
    owned = fold(record(GROUP, 102), record(GROUP, 101), record(NETNS, "swl7-ab12"), record(DIR, "/tmp/swl-x"))
    existing = ["swl7-ab12-br", "swl7-ab12-h0", "swl7-ab12-h1", "swl7-ab123-h0", "swl8-ab12-h0", "other"]
    assert cleanup(owned, existing) == Cleanup(groups=(101, 102), namespaces=("swl7-ab12-br", "swl7-ab12-h0",
                                                                              "swl7-ab12-h1"), dirs=("/tmp/swl-x",))


def test_a_released_group_is_never_signalled() -> None:
    # A restarted service: the old group's number may belong to an unrelated process by the time the owner dies.
    owned = fold(record(GROUP, 101), record(GROUP, 102), record(RELEASE, 101), record(GROUP, 103))
    assert cleanup(owned, []).groups == (102, 103)


def test_a_clean_teardown_leaves_nothing_to_do() -> None:
    owned = fold(record(GROUP, 101), record(NETNS, "swl7-ab12"), record(DIR, "/tmp/swl-x"), record(DONE))
    plan = cleanup(owned, ["swl7-ab12-h0"])
    assert plan == Cleanup() and not plan


def test_nothing_recorded_is_nothing_to_do() -> None:
    assert not cleanup(Owned(), ["swl7-ab12-h0"])


@pytest.mark.parametrize("line", [
    "group 0",  # killpg(0) is the reaper's own group
    "group 1",  # init's
    "group -5", "group x", "group", "release 1",
    "dir relative/path", "dir /", "dir /tmp/../etc", "dir /tmp//x", "dir",
    "netns", "netns a/b", "netns a b",
    "done now", "rm -rf /", "",
])
def test_malformed_or_unsafe_records_are_refused_and_change_nothing(line: str) -> None:
    owned = fold(record(GROUP, 101))
    with pytest.raises(ValueError):
        apply(owned, line)


def test_a_record_is_one_line() -> None:
    with pytest.raises(ValueError):
        record(DIR, "/tmp/a\ngroup 1")
    assert record(DONE) == b"done\n" and record(GROUP, 42) == b"group 42\n"


def test_a_path_keeps_its_bytes_and_its_spaces() -> None:
    path = "/tmp/swl-a b \udcff "  # spaces inside and at the end, a byte that is not UTF-8
    line = record(DIR, path)
    assert apply(Owned(), line.decode(errors="surrogateescape")).dirs == (path,)
