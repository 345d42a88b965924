"""Connection admission (issue 13): whether a datagram for an unknown connection ID may start a
QUIC connection, as an I/O-free core (the time and the peer's address are passed in).

The endpoint asks `admit_new` for every datagram whose destination CID it does not know, before
it allocates any connection state (`parse_initial` reads the few Initial fields admission needs
straight from the bytes, cheaper than aioquic's header parser: under a flood this path runs per
datagram), and gets back one of

    Admit(odcid, retry_scid)   create the server connection (a half-open slot is now reserved)
    SendRetry(scid, token)     answer with a stateless Retry packet, keep nothing
    SendVersionNegotiation(dcid, scid)
                               answer with a stateless Version Negotiation packet, keep nothing
    Drop(reason)               ignore the datagram (counted under `reason`)

The policy, in order:

1. QUIC's own minimum: a long-header client INITIAL of at least 1200 bytes (RFC 9000 §14.1) with a
   version we speak; anything else for an unknown CID is NOT_INITIAL / UNSUPPORTED_VERSION. A
   long-header datagram of at least 1200 bytes with a version we do not speak gets a Version
   Negotiation packet (RFC 9000 §6.1: shorter than the probe, so no amplification), out of the
   Retry budget and not counted as a refusal: the orchestrator's reachability probe
   (orchestrator/fleet/reach_probe.py) is such a datagram, and any QUIC client's first try of a
   newer version too.
2. Address validation (RFC 9000 §8.1): an Initial with a Retry token must carry a valid one
   (retry_token.py: HMAC'd, bound to address and CIDs, expiring); one without a token gets a
   Retry, unless its source address is a member's (the membership view's edge endpoints:
   members skip the extra round trip) and the member handshake budget has room. Retries
   themselves are rate-limited (`retry_rate`), so a flood costs a bounded number of replies.
3. Caps on half-open handshakes (admitted, not yet completed) per source address and in total.
4. Handshake rate limits (token buckets): `member_handshake_rate` for members' unvalidated
   handshakes, `handshake_rate` for everyone else's, so strangers cannot starve members.

5. Flood mode: `flood_tick` (about once a second, or at once when `flood_suspected`) estimates
   how many Initials without a token unvalidated strangers send; above `retry_rate` (more than we
   would answer) it asks the shell to filter them in the kernel (sockfilter.py: all but 1 in 2**FILTER_SAMPLE_SHIFT dropped before
   they are queued), and to lift the filter after `flood_hold` seconds below half that rate.

Who the peer is gets decided later, in the TLS handshake (certificate pinning, quic_conn.py); what
a peer may send, per stream, in `table.EdgeTable._stream_arrived` (planned producers). The shell
reports what it learns after admission (`refused`: junk that did not decrypt, a refused
certificate, a handshake timeout) and frees the slot (`release`) when a handshake completes or
its connection goes. Refusals are counted, never logged one by one: `take_summary()` hands the
shell one summary per interval (`edge.admission_refused`).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

from swactor.edge.ratelimit import TokenBucket
from swactor.edge.retry_token import InvalidToken, RetryTokens, TokenRefused

MAX_SUMMARY_SOURCES = 256  # distinct sources counted per summary interval (more are only summed)
FILTER_SAMPLE_SHIFT = 4  # while the kernel filter is on, 1 in 16 strangers' token-less Initials get here
VALIDATION_MODES = ("non-members", "all", "off")


class Refusal(enum.IntEnum):
    """Why a datagram or a half-open connection was refused; `key` (the lowercased name) is the
    stable name in summaries and GetStatus. An IntEnum: it indexes the counters on the hot path."""

    NOT_INITIAL = 0  # unknown CID, and not a client Initial of >= 1200 bytes
    UNSUPPORTED_VERSION = 1
    RETRY_RATE = 2  # a Retry was due but the Retry budget is spent
    TOKEN_INVALID = 3  # malformed, forged, or from another address / to another CID
    TOKEN_EXPIRED = 4
    HALF_OPEN_PER_SOURCE = 5
    HALF_OPEN_TOTAL = 6
    HANDSHAKE_RATE = 7
    UNDECRYPTABLE_INITIAL = 8  # admitted, but aioquic could not decrypt it: junk
    PEER_NOT_AUTHORIZED = 9  # TLS: not a member's edge certificate
    HANDSHAKE_TIMEOUT = 10
    BAD_DATAGRAM = 11  # aioquic raised on a datagram of a known connection

    @property
    def key(self) -> str:
        return self.name.lower()


class Initial(NamedTuple):
    """What admission reads of a client Initial (RFC 9000 §17.2.2)."""

    version: int
    dcid: bytes
    scid: bytes
    token: bytes


MAX_CID = 20  # RFC 9000 §17.2


_INITIAL_TYPE = {0x00000001: 0, 0x6B3343CF: 1}  # QUIC v1 (RFC 9000), v2 (RFC 9369): Initial's type bits


def parse_long_header(data: bytes) -> tuple[int, bytes, bytes] | None:
    """(version, dcid, scid) of a long-header packet from the version-independent header (RFC 8999
    §5.1), whatever its version; else None."""
    n = len(data)
    if n < 7 or not data[0] & 0x80:
        return None
    i = 6 + data[5]
    if i >= n or i + 1 + data[i] > n:
        return None
    return int.from_bytes(data[1:5], "big"), data[6:i], data[i + 1:i + 1 + data[i]]


def parse_initial(data: bytes) -> Initial | None:
    """The Initial's fields if `data` starts with a long-header Initial packet (RFC 9000 §17.2.2)
    of a version we know, else None. Hand-written for speed: under a flood it runs per datagram."""
    n = len(data)
    if n < 8 or data[0] & 0xC0 != 0xC0:  # long header, fixed bit
        return None
    version = int.from_bytes(data[1:5], "big")
    if _INITIAL_TYPE.get(version) != (data[0] >> 4) & 3:
        return None
    i = 6 + data[5]  # after the destination CID
    if data[5] > MAX_CID or i >= n or data[i] > MAX_CID:
        return None
    j = i + 1 + data[i]  # after the source CID: the token length (a varint)
    if j >= n:
        return None
    width = 1 << (data[j] >> 6)
    if j + width > n:
        return None
    tlen = int.from_bytes(data[j:j + width], "big") & ((1 << (8 * width - 2)) - 1)
    k = j + width
    if k + tlen > n:
        return None
    return Initial(version, data[6:i], data[i + 1:j], data[k:k + tlen])


@dataclass(frozen=True, slots=True)
class Admit:
    original_dcid: bytes  # for the server's transport parameters
    retry_scid: bytes | None  # set when the address was validated with our Retry
    source: str  # half-open slot key: release(source) exactly once
    member: bool


@dataclass(frozen=True, slots=True)
class SendRetry:
    retry_scid: bytes
    token: bytes


@dataclass(frozen=True, slots=True)
class Drop:
    reason: Refusal


@dataclass(frozen=True, slots=True)
class SendVersionNegotiation:
    dcid: bytes  # the client's destination and source CIDs, echoed swapped (RFC 9000 §17.2.1)
    scid: bytes


Verdict = Admit | SendRetry | SendVersionNegotiation | Drop
_DROPS = [Drop(r) for r in Refusal]  # one instance per reason: nothing allocated per dropped packet


@dataclass(frozen=True)
class AdmissionLimits:
    """The policy's keys of the `[edge]` table (config.EdgeConfig extends this class, so each is declared once)."""

    # QUIC Retry (address validation) for "non-members" (sources that are not a member's edge
    # endpoint address), "all", or "off".
    address_validation: str = "non-members"
    retry_token_lifetime: float = 10.0
    # Retry packets sent per second (burst): what a flood of junk Initials can make us answer.
    retry_rate: float = 1000.0
    retry_burst: float = 1000.0
    # New handshakes per second (burst) from validated strangers, and from members' addresses.
    handshake_rate: float = 50.0
    handshake_burst: float = 50.0
    member_handshake_rate: float = 100.0
    member_handshake_burst: float = 100.0
    # Admitted handshakes not yet completed, in total and per source address.
    max_half_open: int = 256
    max_half_open_per_source: int = 8
    # Under a flood of strangers' Initials (more per second than retry_rate), drop them in the
    # kernel (a socket filter; 1 in 16 still gets here) until flood_hold seconds below half of it.
    kernel_filter: bool = True
    flood_hold: float = 10.0

    def __post_init__(self) -> None:
        if self.address_validation not in VALIDATION_MODES:
            raise ValueError(f"address_validation must be one of {', '.join(VALIDATION_MODES)}, "
                             f"got {self.address_validation!r}")
        if self.max_half_open < 1 or self.max_half_open_per_source < 1:
            raise ValueError("max_half_open and max_half_open_per_source must be >= 1")

    @classmethod
    def of(cls, config: AdmissionLimits) -> AdmissionLimits:
        """The limits alone, out of an EdgeConfig."""
        return cls(**{f: getattr(config, f) for f in cls.__dataclass_fields__})


def normalize_host(host: str) -> str:
    """An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d; members are listed as a.b.c.d."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host


class ConnectionAdmission:
    def __init__(self, limits: AdmissionLimits, supported_versions: list[int], *, now: float,
                 is_member: Callable[[str], bool], token_key: bytes | None = None,
                 new_cid: Callable[[], bytes] = lambda: os.urandom(8)) -> None:
        self.limits = limits
        self._mode = limits.address_validation
        self.supported_versions = frozenset(supported_versions)
        self.is_member = is_member
        self.tokens = RetryTokens(limits.retry_token_lifetime, token_key)
        self._new_cid = new_cid
        self._retry_bucket = TokenBucket(limits.retry_rate, limits.retry_burst, now)
        self._handshake_bucket = TokenBucket(limits.handshake_rate, limits.handshake_burst, now)
        self._member_bucket = TokenBucket(limits.member_handshake_rate, limits.member_handshake_burst, now)
        self.half_open: dict[str, int] = {}  # source address -> admitted handshakes not yet done
        self.half_open_total = 0
        self._totals = [0] * len(Refusal)  # indexed by Refusal
        self.retries_sent = 0
        self.version_negotiations_sent = 0
        self.admitted = 0
        self._window = [0] * len(Refusal)
        self._window_any = False
        self._window_sources: dict[str, int] = {}
        self._window_overflow = 0  # refusals from sources beyond MAX_SUMMARY_SOURCES
        self._window_retries = 0
        self._window_admitted = 0
        self.filtering = False  # the kernel filter is (asked to be) on
        self.stranger_initials = 0  # token-less Initials from non-members since the last flood_tick
        self._tick_at = now
        self._calm_since: float | None = None
        self.flood_rate = 0.0  # the last estimate, Initials/s

    # ---- the decision ----

    def admit_new(self, data: bytes, addr: tuple[str, int], now: float) -> tuple[Verdict, Initial | None]:
        """The verdict on a datagram for an unknown CID, and its Initial fields when it has them."""
        big = len(data) >= SMALLEST_MAX_DATAGRAM_SIZE
        initial = parse_initial(data) if big else None
        if initial is None:
            header = parse_long_header(data) if big else None
            # version 0 is a Version Negotiation packet itself: never answered (RFC 9000 §6.1)
            if header is not None and header[0] != 0 and header[0] not in self.supported_versions:
                if not self._retry_bucket.take(now):  # stateless replies share the Retry budget
                    return self.refused(Refusal.RETRY_RATE, addr[0]), None
                self.version_negotiations_sent += 1
                return SendVersionNegotiation(header[1], header[2]), None
            return self.refused(Refusal.NOT_INITIAL, addr[0]), None
        return self.admit_initial(initial, addr, now), initial

    @property
    def totals(self) -> dict[Refusal, int]:
        """Refusals since start, by reason."""
        return {r: self._totals[r] for r in Refusal}

    def admit_initial(self, header: Initial, addr: tuple[str, int], now: float) -> Verdict:
        """The policy for a client Initial of >= 1200 bytes (the module doc, steps 1-4)."""
        if header.version not in self.supported_versions:
            return self.refused(Refusal.UNSUPPORTED_VERSION, addr[0])
        source = addr[0]
        if source[0] == ":":
            source = normalize_host(source)
        mode = self._mode
        retry_scid: bytes | None = None
        if header.token:
            try:
                odcid = self.tokens.check(header.token, addr, header.dcid, now)
            except InvalidToken as e:
                return self.refused(Refusal.TOKEN_EXPIRED if e.why is TokenRefused.EXPIRED else Refusal.TOKEN_INVALID,
                                    source)
            retry_scid, member = header.dcid, False  # validated: the strangers' budget
        else:
            odcid = header.dcid
            member = mode != "all" and self.is_member(source)
            if not member:
                self.stranger_initials += 1
            if mode == "all" or (not member and mode == "non-members") or (
                    member and mode == "non-members" and self._member_bucket.available(now) < 1.0):
                # A member over its budget is validated like a stranger: a flood that spoofs a
                # member's address cannot lock the member out, it only costs it one round trip.
                return self._retry(addr, source, odcid, now)
        if self.half_open.get(source, 0) >= self.limits.max_half_open_per_source:
            return self.refused(Refusal.HALF_OPEN_PER_SOURCE, source)
        if self.half_open_total >= self.limits.max_half_open:
            return self.refused(Refusal.HALF_OPEN_TOTAL, source)
        bucket = self._member_bucket if member else self._handshake_bucket
        if not bucket.take(now):
            return self.refused(Refusal.HANDSHAKE_RATE, source)
        self.half_open[source] = self.half_open.get(source, 0) + 1
        self.half_open_total += 1
        self.admitted += 1
        self._window_admitted += 1
        return Admit(odcid, retry_scid, source, member)

    def _retry(self, addr: tuple[str, int], source: str, odcid: bytes, now: float) -> Verdict:
        if not self._retry_bucket.take(now):
            return self.refused(Refusal.RETRY_RATE, source)
        scid = self._new_cid()
        self.retries_sent += 1
        self._window_retries += 1
        return SendRetry(scid, self.tokens.mint(addr, odcid, scid, now))

    # ---- flood mode ----

    def flood_tick(self, now: float) -> bool | None:
        """Judge the last interval's strangers' Initials: True = put the kernel filter on, False =
        take it off, None = no change. The shell calls this about once a second while strangers
        come or the filter is on."""
        elapsed = max(now - self._tick_at, 1e-3)
        seen = self.stranger_initials << (FILTER_SAMPLE_SHIFT if self.filtering else 0)
        self._tick_at, self.stranger_initials = now, 0
        self.flood_rate = seen / elapsed
        limit = self.limits.retry_rate
        if not self.filtering:
            if self.limits.kernel_filter and self.flood_rate > limit:
                self.filtering, self._calm_since = True, None
                return True
            return None
        if self.flood_rate > limit / 2:
            self._calm_since = None
        elif self._calm_since is None:
            self._calm_since = now
        elif now - self._calm_since >= self.limits.flood_hold:
            self.filtering = False
            return False
        return None

    @property
    def flood_suspected(self) -> bool:
        """More strangers' token-less Initials since the last flood_tick than `retry_rate` (a second's
        Retry budget), with the filter off: judge now, not at the next tick, so a flood saturates
        the event loop for milliseconds rather than a whole tick."""
        return not self.filtering and self.limits.kernel_filter and self.stranger_initials > self.limits.retry_rate

    def filter_failed(self) -> None:
        """The shell could not attach the filter (IPv6 socket, kernel refused): userspace only."""
        self.filtering = False

    # ---- what the shell reports ----

    def release(self, source: str) -> None:
        """An admitted handshake completed, or its connection went: its half-open slot is free."""
        n = self.half_open.get(source, 0)
        if n <= 1:
            self.half_open.pop(source, None)
        else:
            self.half_open[source] = n - 1
        if n:
            self.half_open_total -= 1

    def refused(self, reason: Refusal, source: str) -> Drop:
        """Count a refusal (O(1), no allocation); the Drop for `reason`."""
        self._totals[reason] += 1
        self._window[reason] += 1
        self._window_any = True
        sources = self._window_sources
        n = sources.get(source)
        if n is not None:
            sources[source] = n + 1
        elif len(sources) < MAX_SUMMARY_SOURCES:
            sources[source] = 1
        else:
            self._window_overflow += 1
        return _DROPS[reason]

    # ---- the periodic summary ----

    @property
    def has_refusals(self) -> bool:
        """Refusals since the last summary (the shell arms its summary timer)."""
        return self._window_any

    def take_summary(self) -> dict[str, Any] | None:
        """Counts since the last summary (None when nothing was refused), and a fresh window."""
        if not self._window_any:
            self._window_retries = self._window_admitted = 0
            return None
        top = max(self._window_sources.items(), key=lambda kv: kv[1]) if self._window_sources else ("", 0)
        summary = {
            "refused": {r.key: self._window[r] for r in Refusal if self._window[r]},
            "retries_sent": self._window_retries,
            "admitted": self._window_admitted,
            "sources": len(self._window_sources) + (1 if self._window_overflow else 0),
            "sources_capped": self._window_overflow > 0,
            "top_source": top[0],
            "top_source_refusals": top[1],
            "half_open": self.half_open_total,
        }
        self._window, self._window_sources, self._window_any = [0] * len(Refusal), {}, False
        self._window_overflow = self._window_retries = self._window_admitted = 0
        return summary
