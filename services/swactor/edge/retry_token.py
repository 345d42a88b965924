"""QUIC Retry tokens (RFC 9000 §8.1.2, §17.2.5): stateless proof that a client receives packets
at the address it sends from. Pure: the time is passed in, the key is per process.

    token = VERSION (1) | issued_ms (8, big-endian) | len(odcid) (1) | odcid | tag (16)
    tag   = HMAC-SHA256(key, VERSION | issued_ms | address | odcid | retry_scid)[:16]

`address` is the client's IP and UDP port; `odcid` the Destination Connection ID of its first
Initial (the server must echo it in its transport parameters); `retry_scid` the Source Connection
ID of our Retry packet, which the client must use as Destination CID from then on, so it is
authenticated but not carried. A token is refused when its tag does not verify (forged, altered,
or replayed from another address or to another CID), or when it is older than `lifetime` (or
from the future: the issuing clock is this process's monotonic clock). Nothing is stored per
token: the same token may be replayed from the same address within its lifetime, which the
caps on half-open handshakes bound (admission.py).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import os

VERSION = 1
TAG_LEN = 16
MAX_CID_LEN = 20  # RFC 9000 §17.2


class TokenRefused(enum.Enum):
    MALFORMED = "malformed"
    INVALID = "invalid"  # the tag does not verify: forged, or another address / CID
    EXPIRED = "expired"


class InvalidToken(ValueError):
    def __init__(self, why: TokenRefused, detail: str) -> None:
        super().__init__(detail)
        self.why = why


def encode_address(addr: tuple[str, int]) -> bytes:
    host = addr[0]
    if host.startswith("::ffff:") and "." in host:  # an IPv4 peer on a dual-stack socket
        host = host[7:]
    return ipaddress.ip_address(host).packed + addr[1].to_bytes(2, "big")


class RetryTokens:
    def __init__(self, lifetime: float, key: bytes | None = None) -> None:
        if lifetime <= 0:
            raise ValueError(f"retry token lifetime must be > 0, got {lifetime}")
        self.lifetime = lifetime
        self._key = key if key is not None else os.urandom(32)

    def _tag(self, issued: bytes, addr: tuple[str, int], odcid: bytes, retry_scid: bytes) -> bytes:
        msg = bytes([VERSION]) + issued + encode_address(addr) + bytes([len(odcid)]) + odcid + retry_scid
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:TAG_LEN]

    def mint(self, addr: tuple[str, int], odcid: bytes, retry_scid: bytes, now: float) -> bytes:
        issued = int(now * 1000).to_bytes(8, "big")
        return bytes([VERSION]) + issued + bytes([len(odcid)]) + odcid + self._tag(issued, addr, odcid, retry_scid)

    def check(self, token: bytes, addr: tuple[str, int], dcid: bytes, now: float) -> bytes:
        """The original destination CID the token vouches for; InvalidToken otherwise. `dcid`: the
        Destination CID of the Initial that carries the token (our Retry's source CID)."""
        if len(token) < 10 + TAG_LEN or token[0] != VERSION:
            raise InvalidToken(TokenRefused.MALFORMED, "not a retry token of this version")
        issued, n = token[1:9], token[9]
        if n > MAX_CID_LEN or len(token) != 10 + n + TAG_LEN:
            raise InvalidToken(TokenRefused.MALFORMED, "retry token has a bad length")
        odcid, tag = token[10:10 + n], token[10 + n:]
        if not hmac.compare_digest(tag, self._tag(issued, addr, odcid, dcid)):
            raise InvalidToken(TokenRefused.INVALID, "retry token does not verify for this address and CID")
        age = now - int.from_bytes(issued, "big") / 1000
        if not -1.0 <= age <= self.lifetime:  # 1 s slack: the ms stamp rounds down
            raise InvalidToken(TokenRefused.EXPIRED, f"retry token is {age:.1f} s old (lifetime {self.lifetime} s)")
        return odcid
