"""The cluster secret: one per cluster, from a file; every gossip packet is sealed with a key
derived from it, so a node with another secret can neither read nor join (its packets are
dropped and counted as decrypt failures)."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

_LABEL = b"swactor membership gossip key v1"
MIN_SECRET_BYTES = 16


class SecretError(ValueError):
    """The secret file is missing, unreadable or too short."""


def read_secret(path: Path | None) -> bytes:
    if path is None:
        raise SecretError("no cluster secret: set [membership].secret_file or pass --secret-file")
    try:
        secret = path.read_bytes().strip()
    except FileNotFoundError:
        raise SecretError(f"cluster secret file {path} does not exist") from None
    except PermissionError:
        raise SecretError(f"cluster secret file {path} is not readable by this user") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"cluster secret in {path} is {len(secret)} bytes; at least {MIN_SECRET_BYTES} needed")
    return secret


def gossip_key(secret: bytes, cluster: str) -> bytes:
    """32-byte key for the gossip AEAD: HKDF-SHA256 (one block) over the secret and cluster label."""
    prk = hmac.new(b"swactor/" + cluster.encode(), secret, hashlib.sha256).digest()
    return hmac.new(prk, _LABEL + b"\x01", hashlib.sha256).digest()
