"""The probe timings measured RTTs call for (membership/probe_timing.py): tables over the pure advice, no clocks; the
advice kept in the state directory and the timings the next start takes from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.membership.probe_timing import (
    ADVICE_FILE,
    CHANGE_SHARE,
    DEFAULT_PROBE,
    INTERVAL_OVER_TIMEOUT,
    RTT_FACTOR,
    Advice,
    ProbeAdvisor,
    ProbeTiming,
    advised,
    load_advice,
    save_advice,
    starting_timing,
)
from swactor.membership.rtt import RttTable

LAN = ProbeTiming(probe_timeout_s=0.5, probe_interval_s=1.0)


@pytest.mark.parametrize(("rtt_ms", "timeout_s", "interval_s"), [
    (0.0, 0.5, 1.0),  # nothing measured: as configured
    (0.2, 0.5, 1.0),  # a LAN
    (75.0, 0.5, 1.0),  # 6.5 x 75 ms = 488 ms: the LAN timeout still covers it
    (150.0, 0.975, 1.95),  # the timings that held the 150 ms / 2 % soak (the LAN ones did not)
    (200.0, 1.3, 2.6),  # the timeout follows the RTT, the interval keeps room for the indirect probes
    (1000.0, 6.5, 13.0),
])
def test_the_timeout_is_the_larger_of_the_configured_and_a_multiple_of_the_rtt(
        rtt_ms: float, timeout_s: float, interval_s: float) -> None:
    t = advised(LAN, rtt_ms)
    assert (t.probe_timeout_s, t.probe_interval_s) == pytest.approx((timeout_s, interval_s))
    assert t.probe_timeout_s == pytest.approx(max(LAN.probe_timeout_s, RTT_FACTOR * rtt_ms / 1000))
    assert t.probe_interval_s >= INTERVAL_OVER_TIMEOUT * t.probe_timeout_s - 1e-9


def test_a_long_configured_interval_is_kept() -> None:
    assert advised(ProbeTiming(3.0, 5.0), 150.0) == ProbeTiming(3.0, 5.0)  # kinship's wan() preset
    assert advised(ProbeTiming(0.5, 10.0), 400.0) == pytest.approx(ProbeTiming(2.6, 10.0))


def test_the_advisor_speaks_when_the_advice_moves_by_more_than_the_change_share() -> None:
    adv = ProbeAdvisor(LAN)
    assert adv.observe({}) is None  # nothing measured: the configured timings stand
    assert adv.observe({2: 200, 3: 70_000}) is None  # 70 ms: still covered
    a = adv.observe({2: 200, 3: 70_000, 4: 250_000})
    assert a is not None and not a.sufficient
    assert (a.peer, a.rtt_ms, a.configured) == (4, 250.0, LAN)
    assert a.timing == pytest.approx(ProbeTiming(1.625, 3.25))
    assert adv.observe({4: 260_000}) is None  # 1.69 s: within CHANGE_SHARE of the last told
    moved = adv.observe({4: int(250_000 * (1 + CHANGE_SHARE) + 10_000)})
    assert moved is not None and moved.timing.probe_timeout_s > 1.625 * (1 + CHANGE_SHARE)
    back = adv.observe({4: 1_000})  # the far peer went (or came closer): the configured timings suffice again
    assert back is not None and back.sufficient and back.timing == LAN
    assert adv.observe({}) is None


def test_the_advisor_reads_this_nodes_own_medians() -> None:
    t = RttTable(1, stale_s=10)
    for i, rtt_us in enumerate([300_000, 310_000, 900_000]):  # one slow echo: the median stays 310 ms
        pong = RttTable.pong_for(RttTable.ping(i))
        assert pong is not None
        t.on_pong(2, pong, i + rtt_us * 1000, now_s=0)
    assert t.own(now_s=1) == {2: 310_000}
    assert t.own(now_s=11) == {}  # stale: not a live peer's RTT any more
    a = ProbeAdvisor(DEFAULT_PROBE).observe(t.own(now_s=1))
    assert a is not None and a.timing == pytest.approx(ProbeTiming(2.015, 4.03))


def test_advice_is_kept_for_the_next_start_and_removed_once_the_configured_timings_suffice(tmp_path: Path) -> None:
    assert load_advice(tmp_path) is None  # nothing kept: start as configured
    far = Advice(ProbeTiming(1.625, 3.25), LAN, peer=4, rtt_ms=250.0)
    save_advice(tmp_path, far)
    assert load_advice(tmp_path) == far.timing
    assert [p.name for p in tmp_path.iterdir()] == [ADVICE_FILE]  # written whole: no temporary file left
    save_advice(tmp_path, Advice(LAN, LAN, peer=4, rtt_ms=1.0))  # the far peer went: the configured timings suffice
    assert load_advice(tmp_path) is None


@pytest.mark.parametrize(("saved", "started"), [
    (None, LAN),
    (ProbeTiming(1.625, 3.25), ProbeTiming(1.625, 3.25)),  # the pool measured far: the longer timings
    (ProbeTiming(0.4, 0.8), LAN),  # shorter than configured: the operator's timings stand
    (ProbeTiming(1.2, 1.5), ProbeTiming(1.2, 1.5)),
])
def test_the_next_start_takes_the_longer_of_the_configured_and_the_kept(saved: ProbeTiming | None, started: ProbeTiming) -> None:
    assert starting_timing(LAN, saved) == started
    assert starting_timing(ProbeTiming(3.0, 5.0), saved) == ProbeTiming(3.0, 5.0)  # a long configured timeout stands


@pytest.mark.parametrize(("saved", "seed_rtt_ms", "started"), [
    (None, 0.0, LAN),  # no seed measured (the pool's first host, or none answered)
    (None, 0.3, LAN),  # a seed on the LAN
    (None, 150.0, ProbeTiming(0.975, 1.95)),  # a seed 150 ms away: from the first start, not only the next
    (ProbeTiming(1.625, 3.25), 150.0, ProbeTiming(1.625, 3.25)),  # the last run met a farther peer than the seed
    (ProbeTiming(0.6, 1.2), 150.0, ProbeTiming(0.975, 1.95)),  # the seed is farther than the kept advice's peer
])
def test_a_joining_node_starts_on_the_longer_of_the_kept_advice_and_its_seeds_round_trip(
        saved: ProbeTiming | None, seed_rtt_ms: float, started: ProbeTiming) -> None:
    assert starting_timing(LAN, saved, seed_rtt_ms) == started
    assert starting_timing(ProbeTiming(3.0, 5.0), saved, seed_rtt_ms) == ProbeTiming(3.0, 5.0)


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", "probe_timing.json"),
    ('{"probe_timeout_s": 1.0}', "not a probe timing advice"),
    ('{"probe_timeout_s": "x", "probe_interval_s": 2}', "not a probe timing advice"),
    ('{"probe_timeout_s": 3.0, "probe_interval_s": 2.0}', "at most probe_interval_s 2"),
    ('{"probe_timeout_s": 0, "probe_interval_s": 2.0}', "must be > 0"),
])
def test_a_damaged_advice_file_is_named(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / ADVICE_FILE).write_text(text)
    with pytest.raises(ValueError, match=match):
        load_advice(tmp_path)


def test_an_advisor_started_on_kept_timings_speaks_when_the_pool_no_longer_needs_them() -> None:
    kept = ProbeTiming(1.625, 3.25)
    adv = ProbeAdvisor(LAN, running=kept)
    assert adv.observe({}) is None  # no peer measured yet: not "sufficient", which would drop the kept advice
    assert adv.observe({4: 250_000}) is None  # what it runs with is what the pool needs: nothing new
    back = adv.observe({4: 1_000})
    assert back is not None and back.sufficient and back.timing == LAN


def test_the_service_starts_on_the_kept_timings_and_says_so(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from swactor.membership.config import MembershipConfig
    from swactor.membership.main import starting_probe_timing

    cfg = MembershipConfig(state_dir=tmp_path)
    with capture_logs() as logs:
        assert starting_probe_timing(cfg, LAN, {}) == LAN
    assert logs == []
    save_advice(tmp_path, Advice(ProbeTiming(1.625, 3.25), LAN, peer=4, rtt_ms=250.0))
    with capture_logs() as logs:
        assert starting_probe_timing(cfg, LAN, {}) == ProbeTiming(1.625, 3.25)
    assert [(e["event"], e["probe_timeout_s"], e["configured_probe_timeout_s"], e["reason"]) for e in logs] == \
        [("membership_probe_timing_applied", 1.625, 0.5, "kept_advice")]
    with capture_logs() as logs:  # a seed farther than the kept advice's peer
        assert starting_probe_timing(cfg, LAN, {"10.0.0.2:7946": 20.0, "10.0.0.3:7946": 300.0}) == ProbeTiming(1.95, 3.9)
    assert [(e["event"], e["reason"], e["source"], e["seed_rtt_ms"]) for e in logs] == \
        [("membership_probe_timing_applied", "seed_rtt", "10.0.0.3:7946", 300.0)]
    (tmp_path / ADVICE_FILE).write_text("{damaged")
    with capture_logs() as logs:
        assert starting_probe_timing(cfg, LAN, {}) == LAN  # as configured, and said
    assert [e["event"] for e in logs] == ["membership_probe_advice_unreadable"]
