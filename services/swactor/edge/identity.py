"""The node's edge TLS identity: an ECDSA P-256 key and a self-signed certificate made at install.

Peers do not trust a CA: each side pins the other's certificate by the SHA-256 fingerprint of its
DER encoding, which membership gossips (NodeMetadata.edge_cert_fingerprint).
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from swactor.common.files import write_atomic

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"


class IdentityError(ValueError):
    """The certificate or key is missing, unreadable, or the two do not match."""


@dataclass(frozen=True)
class EdgeIdentity:
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.certificate)


def fingerprint(cert: x509.Certificate) -> str:
    """Lowercase hex SHA-256 of the certificate's DER encoding."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def default_paths(state_dir: Path) -> tuple[Path, Path]:
    return state_dir / "edge" / CERT_FILE, state_dir / "edge" / KEY_FILE


def create_identity(cert_path: Path, key_path: Path, node_id: int, *, days: int = 3650) -> EdgeIdentity:
    """Write a fresh key (mode 0600) and a self-signed certificate naming the node id."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"swactor-edge-{node_id}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    key_path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # The key first: a certificate on disk always has its key beside it.
    write_atomic(key_path, key_pem, 0o600)
    write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return EdgeIdentity(cert, key)


def load_identity(cert_path: Path, key_path: Path) -> EdgeIdentity:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except FileNotFoundError:
        raise IdentityError(f"edge certificate {cert_path} does not exist (run swactor-edge --init-identity)") from None
    except ValueError as e:
        raise IdentityError(f"edge certificate {cert_path} is not a PEM certificate: {e}") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError:
        raise IdentityError(f"edge key {key_path} does not exist (run swactor-edge --init-identity)") from None
    except (ValueError, TypeError) as e:
        raise IdentityError(f"edge key {key_path} is not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise IdentityError(f"edge key {key_path} is not an EC key")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        raise IdentityError(f"edge key {key_path} does not belong to certificate {cert_path}")
    return EdgeIdentity(cert, key)
