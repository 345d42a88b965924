"""The admission core (issue 13), pure: token bucket, Retry tokens, caps and rates of new QUIC
connections, the refusal summary. Time is passed in; no sockets, no loop."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicProtocolVersion, pull_quic_header

from swactor.edge.admission import (
    FILTER_SAMPLE_SHIFT,
    MAX_SUMMARY_SOURCES,
    AdmissionLimits,
    Admit,
    ConnectionAdmission,
    Drop,
    Initial,
    Refusal,
    SendRetry,
    SendVersionNegotiation,
    parse_initial,
)
from swactor.edge.config import EdgeConfig
from swactor.edge.ratelimit import TokenBucket
from swactor.edge.retry_token import InvalidToken, RetryTokens, TokenRefused
from tests.harness.udp_flood import junk_initial

V1 = QuicProtocolVersion.VERSION_1
MEMBER, STRANGER, OTHER = "10.0.0.1", "192.0.2.7", "192.0.2.8"

# ---- token bucket ----


def test_bucket_spends_its_burst_then_refills_at_its_rate() -> None:
    b = TokenBucket(rate=4.0, burst=3, now=100.0)
    assert [b.take(100.0) for _ in range(4)] == [True, True, True, False]
    assert not b.take(100.125)  # half a token
    assert b.take(100.25) and not b.take(100.25)
    assert b.available(200.0) == 3  # never beyond the burst
    assert b.take(200.0) and b.available(200.0) == 2
    assert b.take(150.0)  # a clock that steps back spends what is there and refills nothing
    assert b.available(200.0) == 1


def test_bucket_edges() -> None:
    assert not TokenBucket(rate=5.0, burst=0, now=0.0).take(10.0)
    never = TokenBucket(rate=0.0, burst=1, now=0.0)
    assert never.take(0.0) and not never.take(1e9)
    with pytest.raises(ValueError, match="rate >= 0"):
        TokenBucket(rate=-1.0, burst=1, now=0.0)


# ---- retry tokens ----

ODCID, RSCID = b"\x01" * 8, b"\x02" * 8


def test_retry_token_round_trip_and_expiry() -> None:
    t = RetryTokens(lifetime=10.0, key=b"k" * 32)
    tok = t.mint((STRANGER, 4433), ODCID, RSCID, now=50.0)
    assert t.check(tok, (STRANGER, 4433), RSCID, now=59.9) == ODCID
    with pytest.raises(InvalidToken) as e:
        t.check(tok, (STRANGER, 4433), RSCID, now=60.1)
    assert e.value.why is TokenRefused.EXPIRED


@pytest.mark.parametrize(("addr", "dcid"), [
    ((OTHER, 4433), RSCID),  # replayed from another address
    ((STRANGER, 4434), RSCID),  # ... or another port of it
    ((STRANGER, 4433), b"\x03" * 8),  # sent to another CID than our Retry's
])
def test_retry_token_is_bound_to_address_and_cid(addr: tuple[str, int], dcid: bytes) -> None:
    t = RetryTokens(lifetime=10.0)
    tok = t.mint((STRANGER, 4433), ODCID, RSCID, now=0.0)
    with pytest.raises(InvalidToken) as e:
        t.check(tok, addr, dcid, now=1.0)
    assert e.value.why is TokenRefused.INVALID


def test_retry_token_forged_altered_or_from_another_process() -> None:
    t = RetryTokens(lifetime=10.0)
    tok = t.mint((STRANGER, 1), ODCID, RSCID, now=0.0)
    altered = tok[:-1] + bytes([tok[-1] ^ 1])
    older = tok[:1] + (500).to_bytes(8, "big") + tok[9:]  # a forged issue time (0.5 s, not 0)
    for bad in (altered, older, RetryTokens(lifetime=10.0).mint((STRANGER, 1), ODCID, RSCID, now=0.0)):
        with pytest.raises(InvalidToken) as e:
            t.check(bad, (STRANGER, 1), RSCID, now=1.0)
        assert e.value.why is TokenRefused.INVALID
    for junk in (b"", b"\x01" * 5, b"\x07" + tok[1:], tok + b"x"):
        with pytest.raises(InvalidToken) as e:
            t.check(junk, (STRANGER, 1), RSCID, now=1.0)
        assert e.value.why is TokenRefused.MALFORMED


def test_retry_token_accepts_ipv4_mapped_addresses() -> None:
    t = RetryTokens(lifetime=10.0)
    tok = t.mint(("::ffff:192.0.2.7", 9), ODCID, RSCID, now=0.0)
    assert t.check(tok, (STRANGER, 9), RSCID, now=0.0) == ODCID


# ---- admission ----

_cids = itertools.count(1)


def new_cid() -> bytes:
    return next(_cids).to_bytes(8, "big")


def initial(*, token: bytes = b"", dcid: bytes | None = None, version: int = V1) -> Initial:
    return Initial(version, dcid or new_cid(), b"\xcc" * 8, token)


def admission(now: float = 0.0, **limits: object) -> ConnectionAdmission:
    return ConnectionAdmission(AdmissionLimits(**limits), [V1], now=now,  # type: ignore[arg-type]
                               is_member=lambda host: host == MEMBER, new_cid=new_cid)


def through_retry(a: ConnectionAdmission, source: str, now: float, port: int = 5000) -> Admit | Drop:
    """A stranger's handshake the honest way: Initial, our Retry, Initial with the token."""
    retry = a.admit_initial(initial(), (source, port), now)
    assert isinstance(retry, SendRetry), retry
    out = a.admit_initial(initial(token=retry.token, dcid=retry.retry_scid), (source, port), now)
    assert not isinstance(out, SendRetry)
    return out


def test_limits_match_the_edge_config_keys() -> None:
    assert AdmissionLimits.of(EdgeConfig()) == AdmissionLimits()
    with pytest.raises(ValueError, match="address_validation"):
        AdmissionLimits(address_validation="sometimes")


def test_parse_initial_reads_what_aioquic_reads() -> None:
    real = []
    for version in (QuicProtocolVersion.VERSION_1, QuicProtocolVersion.VERSION_2):
        client = QuicConnection(configuration=QuicConfiguration(is_client=True, supported_versions=[version]))
        client.connect(("127.0.0.1", 1), now=0.0)
        real.append(client.datagrams_to_send(now=0.0)[0][0])
    for data in (*real, junk_initial(token=b"t" * 100), junk_initial(dcid=b"d" * 20)):
        hdr = pull_quic_header(Buffer(data=data), host_cid_length=8)
        got = parse_initial(data)
        assert got == Initial(hdr.version, hdr.destination_cid, hdr.source_cid, hdr.token)  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [
    b"", b"\xc3\x00\x00\x00\x01", bytes([0x43]) + bytes(1300),  # empty, cut short, a short header
    bytes([0xE3]) + bytes(1300),  # long header, but a Handshake packet
    bytes([0xC3, 0, 0, 0, 1, 21]) + bytes(1300),  # a CID longer than QUIC allows
    bytes([0xC3, 0, 0, 0, 1, 8]) + bytes(8) + bytes([8]) + bytes(8) + b"\x7f\xff",  # token beyond the end
])
def test_parse_initial_refuses_what_is_not_an_initial(data: bytes) -> None:
    assert parse_initial(data) is None


def test_not_an_initial_is_dropped_before_anything_else() -> None:
    a = admission()
    short = bytes([0x43]) + bytes(1299)
    assert a.admit_new(short, (MEMBER, 1), 0.0) == (Drop(Refusal.NOT_INITIAL), None)
    small = junk_initial(size=1199)  # RFC 9000 §14.1: a client's first datagram is >= 1200 bytes
    assert a.admit_new(small, (MEMBER, 1), 0.0) == (Drop(Refusal.NOT_INITIAL), None)
    assert a.admit_initial(initial(version=0x0A0A0A0A), (MEMBER, 1), 0.0) == Drop(Refusal.UNSUPPORTED_VERSION)
    verdict, fields = a.admit_new(junk_initial(), (MEMBER, 1), 0.0)
    assert isinstance(verdict, Admit) and fields is not None and verdict.original_dcid == fields.dcid
    assert a.half_open_total == 1 and a.retries_sent == 0


def test_an_unknown_version_gets_version_negotiation_not_a_refusal() -> None:
    """RFC 9000 §6.1: a long header of a version we do not speak, >= 1200 bytes, is answered with a Version
    Negotiation packet (the orchestrator's reachability probe is one); nothing is kept or counted as refused."""
    a = admission(retry_rate=1.0, retry_burst=2.0)
    dcid, scid = b"\x11" * 8, b"\x22" * 5
    probe = bytes([0xF0]) + (0x1A2A3A4A).to_bytes(4, "big") + bytes([8]) + dcid + bytes([5]) + scid
    probe += bytes(1200 - len(probe))
    assert a.admit_new(probe, ("203.0.113.9", 1), 0.0) == (SendVersionNegotiation(dcid, scid), None)
    assert a.version_negotiations_sent == 1 and a.half_open_total == 0 and not any(a.totals.values())
    vn = bytes([0x80, 0, 0, 0, 0, 8]) + dcid + bytes([5]) + scid + bytes(1200)  # a VN packet itself: never answered
    assert a.admit_new(vn, ("203.0.113.9", 1), 0.0) == (Drop(Refusal.NOT_INITIAL), None)
    assert a.admit_new(probe[:1199], ("203.0.113.9", 1), 0.0) == (Drop(Refusal.NOT_INITIAL), None)  # too small
    # stateless replies share the Retry budget: a flood of probes costs at most retry_rate answers a second
    assert isinstance(a.admit_new(probe, ("203.0.113.9", 1), 0.0)[0], SendVersionNegotiation)
    assert a.admit_new(probe, ("203.0.113.9", 1), 0.0) == (Drop(Refusal.RETRY_RATE), None)
    assert a.version_negotiations_sent == 2


def test_members_skip_retry_strangers_are_validated_first() -> None:
    a = admission()
    hdr = initial()
    got = a.admit_initial(hdr, (MEMBER, 7400), 0.0)
    assert got == Admit(hdr.dcid, None, MEMBER, True)
    first = initial()
    retry = a.admit_initial(first, (STRANGER, 5000), 0.0)
    assert isinstance(retry, SendRetry) and a.half_open_total == 1  # nothing kept for the stranger yet
    back = a.admit_initial(initial(token=retry.token, dcid=retry.retry_scid), (STRANGER, 5000), 0.5)
    assert back == Admit(first.dcid, retry.retry_scid, STRANGER, False)
    assert a.half_open == {MEMBER: 1, STRANGER: 1}


def test_token_replayed_from_another_address_or_too_late_is_refused() -> None:
    a = admission(retry_token_lifetime=10.0)
    retry = a.admit_initial(initial(), (STRANGER, 5000), 0.0)
    assert isinstance(retry, SendRetry)
    replay = initial(token=retry.token, dcid=retry.retry_scid)
    assert a.admit_initial(replay, (OTHER, 5000), 1.0) == Drop(Refusal.TOKEN_INVALID)
    assert a.admit_initial(replay, (STRANGER, 5000), 10.5) == Drop(Refusal.TOKEN_EXPIRED)
    assert a.admit_initial(initial(token=b"junk" * 8), (STRANGER, 5000), 1.0) == Drop(Refusal.TOKEN_INVALID)
    assert a.totals[Refusal.TOKEN_INVALID] == 2 and a.totals[Refusal.TOKEN_EXPIRED] == 1


def test_half_open_caps_per_source_and_in_total() -> None:
    a = admission(max_half_open_per_source=2, max_half_open=3, member_handshake_burst=100)
    admits = [a.admit_initial(initial(), (MEMBER, 7400), 0.0) for _ in range(3)]
    assert [type(x) for x in admits] == [Admit, Admit, Drop] and admits[2] == Drop(Refusal.HALF_OPEN_PER_SOURCE)
    assert isinstance(through_retry(a, STRANGER, 0.0), Admit)  # total 3
    assert through_retry(a, OTHER, 0.0) == Drop(Refusal.HALF_OPEN_TOTAL)
    a.release(MEMBER)  # a handshake completed
    assert a.half_open == {MEMBER: 1, STRANGER: 1} and a.half_open_total == 2
    assert isinstance(through_retry(a, OTHER, 0.0), Admit)
    a.release("never-admitted")  # a stray release changes nothing
    assert a.half_open_total == 3


def test_handshake_rate_limits_strangers_without_touching_members() -> None:
    a = admission(handshake_rate=2.0, handshake_burst=2, max_half_open_per_source=100)
    got = [through_retry(a, STRANGER, 0.0, port) for port in range(3)]
    assert [type(x) for x in got] == [Admit, Admit, Drop] and got[2] == Drop(Refusal.HANDSHAKE_RATE)
    assert isinstance(a.admit_initial(initial(), (MEMBER, 7400), 0.0), Admit)  # members have their own budget
    assert isinstance(through_retry(a, STRANGER, 0.5), Admit)  # one token refilled


def test_member_over_budget_is_validated_like_a_stranger() -> None:
    # A flood spoofing a member's address spends the member budget; the member then gets a Retry
    # (one round trip more), not a refusal, and comes in on the validated path.
    a = admission(member_handshake_rate=0.0, member_handshake_burst=1, max_half_open_per_source=100)
    assert isinstance(a.admit_initial(initial(), (MEMBER, 7400), 0.0), Admit)
    assert isinstance(a.admit_initial(initial(), (MEMBER, 7400), 0.0), SendRetry)
    assert isinstance(through_retry(a, MEMBER, 0.0, 7400), Admit)


def test_retries_are_rate_limited() -> None:
    a = admission(retry_rate=10.0, retry_burst=2)
    got = [a.admit_initial(initial(), (STRANGER, p), 0.0) for p in range(3)]
    assert [type(x) for x in got] == [SendRetry, SendRetry, Drop] and got[2] == Drop(Refusal.RETRY_RATE)
    assert a.retries_sent == 2
    assert isinstance(a.admit_initial(initial(), (STRANGER, 9), 0.1), SendRetry)


@pytest.mark.parametrize(("mode", "member", "stranger"), [
    ("all", SendRetry, SendRetry), ("off", Admit, Admit), ("non-members", Admit, SendRetry)])
def test_validation_modes(mode: str, member: type, stranger: type) -> None:
    a = admission(address_validation=mode)
    assert isinstance(a.admit_initial(initial(), (MEMBER, 1), 0.0), member)
    assert isinstance(a.admit_initial(initial(), (STRANGER, 1), 0.0), stranger)


def test_summary_counts_refusals_per_interval() -> None:
    a = admission(retry_rate=0.0, retry_burst=1)
    assert a.take_summary() is None and not a.has_refusals
    a.admit_initial(initial(), (STRANGER, 1), 0.0)  # the one Retry
    for _ in range(5):
        a.admit_initial(initial(), (STRANGER, 1), 0.0)
    a.admit_new(bytes([0xE3]) + bytes(1299), (OTHER, 1), 0.0)  # a Handshake packet for no connection
    a.refused(Refusal.PEER_NOT_AUTHORIZED, OTHER)
    assert a.has_refusals
    s = a.take_summary()
    assert s is not None
    assert s["refused"] == {"retry_rate": 5, "not_initial": 1, "peer_not_authorized": 1}
    assert (s["retries_sent"], s["sources"], s["top_source"], s["top_source_refusals"]) == (1, 2, STRANGER, 5)
    assert a.take_summary() is None  # a fresh window
    assert a.totals[Refusal.RETRY_RATE] == 5  # totals stay


def test_summary_sources_are_bounded() -> None:
    a = admission()
    for i in range(MAX_SUMMARY_SOURCES + 50):
        a.refused(Refusal.NOT_INITIAL, f"198.51.{i // 250}.{i % 250}")
    s = a.take_summary()
    assert s is not None and s["sources_capped"] and s["refused"] == {"not_initial": MAX_SUMMARY_SOURCES + 50}
    assert len(a._window_sources) == 0


def test_admission_limits_are_frozen_config() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AdmissionLimits().max_half_open = 1  # type: ignore[misc]


# ---- flood mode ----


def strangers(a: ConnectionAdmission, n: int, now: float) -> None:
    for i in range(n):
        a.admit_initial(initial(), (STRANGER, 1000 + i), now)


def test_flood_of_strangers_turns_the_kernel_filter_on_then_off() -> None:
    a = admission(retry_rate=100.0, retry_burst=100, flood_hold=5.0)
    strangers(a, 50, 0.5)
    for _ in range(20):
        a.admit_initial(initial(), (MEMBER, 7400), 0.5)  # members never count
    assert a.flood_tick(1.0) is None and not a.filtering  # 50/s: we answer that many
    strangers(a, 300, 1.5)
    assert a.flood_tick(2.0) is True and a.filtering and a.flood_rate == 300
    strangers(a, 300 >> FILTER_SAMPLE_SHIFT, 2.5)  # what the filter lets through stands for the rest
    assert a.flood_tick(3.0) is None and a.flood_rate == (300 >> FILTER_SAMPLE_SHIFT) << FILTER_SAMPLE_SHIFT
    assert a.flood_tick(4.0) is None  # calm since 4.0
    strangers(a, 4, 4.5)  # 64/s: above half the retry rate, the calm starts over
    assert a.flood_tick(5.0) is None
    for t in (6.0, 7.0, 8.0, 9.0, 10.0):
        assert a.flood_tick(t) is None and a.filtering
    assert a.flood_tick(11.0) is False and not a.filtering


def test_a_flood_is_suspected_as_soon_as_a_seconds_retry_budget_of_strangers_came() -> None:
    a = admission(retry_rate=100.0, retry_burst=100)
    strangers(a, 100, 0.01)
    assert not a.flood_suspected  # within the budget
    strangers(a, 1, 0.02)
    assert a.flood_suspected  # 101 in 20 ms: the shell judges now, not at the tick
    assert a.flood_tick(0.02) is True and a.flood_rate > 100 * 50
    assert not a.flood_suspected  # filtering already
    b = admission(retry_rate=100.0, kernel_filter=False)
    strangers(b, 200, 0.01)
    assert not b.flood_suspected  # no filter to turn on


def test_a_slow_trickle_judged_early_is_no_flood() -> None:
    a = admission(retry_rate=100.0, retry_burst=100)
    strangers(a, 101, 30.0)  # a shell that never ticked for 30 s (it ticks within 1 s of the first)
    assert a.flood_suspected and a.flood_tick(30.0) is None and not a.filtering  # ~3.4/s


def test_flood_filter_can_be_turned_off_and_can_fail() -> None:
    a = admission(retry_rate=10.0, kernel_filter=False)
    strangers(a, 100, 0.5)
    assert a.flood_tick(1.0) is None and not a.filtering
    b = admission(retry_rate=10.0)
    strangers(b, 100, 0.5)
    assert b.flood_tick(1.0) is True
    b.filter_failed()
    assert not b.filtering
