"""The orchestrator's TCP API: off unless configured; when on, TLS and a bearer token on every call.

The Unix socket (`/run/swactor/orchestrator.sock`, 0660 group swactor) is the local operator's
door and stays as it is. The TCP listener is for operators elsewhere, so it serves only TLS (a
certificate the installer makes, or the operator's own) and refuses every call, reflection and
health included, that does not carry `authorization: Bearer <token>` with the token from a file
only its owner may read (0600). The token is compared in constant time (as SHA-256 digests, so
not even its length leaks).

    swactor-orchestrator --init-api-access --api-name 10.0.0.2    # installer: cert, key and token
    swactor --address 10.0.0.2:7440 --tls-ca cert.pem --token-file token nodes
    grpcurl -cacert cert.pem -H "authorization: Bearer $(cat token)" 10.0.0.2:7440 list
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import secrets
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from swactor.common.files import write_atomic

BEARER = "Bearer "
MIN_TOKEN_CHARS = 16
CERT_DAYS = 3650  # self-signed and pinned by the operator's copy: expiry adds no protection


class ApiAccessError(ValueError):
    """The TCP API's certificate, key or token is missing, unreadable, malformed or too open."""


@dataclass(frozen=True)
class ApiAccess:
    """What the TCP listener needs: the TLS key pair (PEM) and the token it expects."""

    cert_pem: bytes
    key_pem: bytes
    token: bytes

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)])


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ApiAccessError(f"{what} {path} does not exist") from None
    except PermissionError:
        raise ApiAccessError(f"{what} {path} is not readable by this user") from None
    except OSError as e:
        raise ApiAccessError(f"{what} {path}: {e.strerror}") from None


def read_token(path: Path) -> bytes:
    """The bearer token: one line of printable ASCII, in a file no one but its owner may read."""
    data = _read(path, "API token file")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ApiAccessError(f"API token file {path} has mode {mode:04o}: it must be 0600 (chmod 600 {path})")
    token = data.strip()
    if len(token) < MIN_TOKEN_CHARS or not all(0x21 <= b < 0x7F for b in token):
        raise ApiAccessError(f"API token file {path} must hold one token of at least {MIN_TOKEN_CHARS} "
                             "printable ASCII characters without spaces")
    return token


def load_key_pair(cert_path: Path, key_path: Path) -> tuple[bytes, bytes]:
    """The certificate chain and key (PEM), checked to belong together: gRPC itself would only
    fail later with an unnamed TLS error."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_pem, key_pem = _read(cert_path, "API TLS certificate"), _read(key_path, "API TLS key")
    if stat.S_IMODE(key_path.stat().st_mode) & 0o007:
        raise ApiAccessError(f"API TLS key {key_path} is readable by others: chmod 600 {key_path}")
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as e:
        raise ApiAccessError(f"API TLS certificate {cert_path} is not a PEM certificate: {e}") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise ApiAccessError(f"API TLS key {key_path} is not an unencrypted PEM private key: {e}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise ApiAccessError(f"API TLS key {key_path} does not belong to certificate {cert_path}")
    return cert_pem, key_pem


def load_access(cert: Path | None, key: Path | None, token_file: Path | None) -> ApiAccess:
    missing = [name for name, value in (("tls_cert", cert), ("tls_key", key), ("token_file", token_file))
               if value is None]
    if missing:
        raise ApiAccessError("[orchestrator].tcp_address is set, so the TCP API serves TLS with a bearer "
                             f"token: set {', '.join(missing)} too (or tcp_address = \"\" to turn it off)")
    assert cert is not None and key is not None and token_file is not None
    cert_pem, key_pem = load_key_pair(cert, key)
    return ApiAccess(cert_pem, key_pem, read_token(token_file))


# ---- the server side: every call must present the token ----

def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call whose `authorization` metadata is not
    `Bearer <token>`; the method is never run and the request is never parsed."""

    def __init__(self, token: bytes) -> None:
        self._want = _digest(BEARER.encode() + token)

    def authorized(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
        """None when the call may proceed, else why not (the status detail)."""
        presented = next((v for k, v in metadata or () if k == "authorization"), None)
        if presented is None:
            return "missing bearer token: send metadata 'authorization: Bearer <token>'"
        raw = presented.encode() if isinstance(presented, str) else presented
        if not hmac.compare_digest(_digest(raw), self._want):
            return "wrong bearer token"
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        why = self.authorized(handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if why is None:
            return handler
        return _refusal(handler, why)


def _refusal(handler: grpc.RpcMethodHandler | None, detail: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as the refused method's (unknown methods are refused the same
    way: an unauthenticated caller learns nothing), aborting with UNAUTHENTICATED."""

    async def abort(_request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

    shape = (bool(handler and handler.request_streaming), bool(handler and handler.response_streaming))
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[shape]
    return make(abort)


# ---- the installer side: a key pair and a token, once ----

def _san(names: Iterable[str]):
    from cryptography import x509

    out = []
    for name in dict.fromkeys(names):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(out)


def create_key_pair(cert_path: Path, key_path: Path, names: Iterable[str],
                    common_name: str = "swactor orchestrator API") -> str:
    """A self-signed EC P-256 certificate for `names` (IP addresses or DNS names the operators
    dial); returns its SHA-256 fingerprint. Operators trust it with `--tls-ca` / `-cacert`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names = list(names)
    if not names:
        raise ApiAccessError("the API certificate needs at least one name (--api-name IP_OR_DNS)")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    for path in (cert_path, key_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(key_path, key_pem, 0o600)
    write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert.fingerprint(hashes.SHA256()).hex()


def ensure_token(token_file: Path) -> bool:
    """A bearer token file made if there is none (0600), an existing one checked; whether it was made."""
    made = not token_file.exists()
    if made:
        token_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(token_file, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
    read_token(token_file)
    return made


def init_access(cert: Path | None, key: Path | None, token_file: Path | None, names: Iterable[str]) -> dict:
    """Make what is missing (key pair, token), keep what exists; what was done, for the installer."""
    if cert is None or key is None or token_file is None:
        raise ApiAccessError("--init-api-access needs [orchestrator].tls_cert, tls_key and token_file set")
    created = []
    if not cert.exists() and not key.exists():
        create_key_pair(cert, key, names)
        created += ["tls_cert", "tls_key"]
    load_key_pair(cert, key)  # an existing pair, or one half missing: named here
    if ensure_token(token_file):
        created.append("token_file")
    return {"tls_cert": str(cert), "tls_key": str(key), "token_file": str(token_file), "created": created}
