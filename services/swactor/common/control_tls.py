"""Mutual TLS for the node control API (stage.proto), rooted in the cluster secret.

Every party that holds the cluster secret derives the same control CA key (HKDF-SHA256 of the
secret -> a P-256 scalar) and the same CA certificate subject. Leaf keys are fresh per process:
- a node serves `node-<node_id>.swactor`; the orchestrator dials with that name as the TLS target
  name, so it only talks to the node it means;
- the orchestrator presents `orchestrator-<node_id>.swactor`; a node requires a client certificate
  chaining to the control CA and accepts only an orchestrator identity (optionally a pinned id).

Without the secret nobody can mint a certificate the other side accepts. Everyone with it is, by
the trust model (§3), a trusted cluster member; the orchestrator role is then an identity claim
checked against the node's configuration and the plan's orchestrator_node_id.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import re
import ssl
import tempfile

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_CA_LABEL = b"swactor control CA v1"
_CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swactor-control-ca")])
_NOT_BEFORE = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
_NOT_AFTER = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_ORCH = re.compile(r"^orchestrator-(\d+)\.swactor$")


def node_name(node_id: int) -> str:
    return f"node-{node_id}.swactor"


def orchestrator_name(node_id: int) -> str:
    return f"orchestrator-{node_id}.swactor"


def _ca_key(secret: bytes) -> ec.EllipticCurvePrivateKey:
    prk = hmac.new(b"swactor/control", secret, hashlib.sha256).digest()
    okm = b"".join(hmac.new(prk, _CA_LABEL + bytes([i]), hashlib.sha256).digest() for i in (1, 2))
    scalar = int.from_bytes(okm[:48], "big") % (_P256_ORDER - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


def _ca_cert(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    pub = key.public_key()
    serial = int.from_bytes(hashlib.sha256(pub.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)).digest()[:16], "big") >> 1
    return (x509.CertificateBuilder().subject_name(_CA_NAME).issuer_name(_CA_NAME).public_key(pub)
            .serial_number(serial).not_valid_before(_NOT_BEFORE).not_valid_after(_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
            .sign(key, hashes.SHA256()))


def _leaf(secret: bytes, dns_name: str, *, server: bool) -> tuple[bytes, bytes, bytes]:
    """(ca_pem, key_pem, cert_pem) for a fresh leaf named `dns_name`."""
    ca_key = _ca_key(secret)
    ca = _ca_cert(ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
            .issuer_name(_CA_NAME).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (ca.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            cert.public_bytes(serialization.Encoding.PEM))


def server_credentials(secret: bytes, node_id: int) -> grpc.ServerCredentials:
    """A node's control listener: requires a client certificate from the control CA."""
    ca, key, cert = _leaf(secret, node_name(node_id), server=True)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


# HTTP/2 keepalive on the control channel, both ends (issue 12): each side pings every interval and
# closes the connection when a ping is not answered within two intervals, so a dead or partitioned
# peer ends the run's WatchStage stream in seconds on both sides -- the orchestrator faults the run,
# the stage's lease (worker/stage_lease.py) starts counting -- instead of whichever run timer fires
# first. Pings are allowed without data in flight: a Ready stage's stream is silent between runs' tokens.
DEFAULT_KEEPALIVE_S = 1.0


def keepalive_options(interval_s: float = DEFAULT_KEEPALIVE_S, *, server: bool) -> list[tuple[str, int]]:
    interval_ms = max(100, int(interval_s * 1000))
    options = [("grpc.keepalive_time_ms", interval_ms), ("grpc.keepalive_timeout_ms", 2 * interval_ms),
               ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
    if server:  # accept the client's pings at that rate instead of answering them with GOAWAY
        options += [("grpc.http2.min_recv_ping_interval_without_data_ms", interval_ms // 2),
                    ("grpc.http2.max_ping_strikes", 0)]
    return options


def channel(secret: bytes, orchestrator_node_id: int, target: str, node_id: int, *,
            keepalive_s: float = DEFAULT_KEEPALIVE_S) -> grpc.aio.Channel:
    """The orchestrator's channel to node `node_id` at `target` (host:port)."""
    ca, key, cert = _leaf(secret, orchestrator_name(orchestrator_node_id), server=False)
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.aio.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", node_name(node_id)),
                                                           *keepalive_options(keepalive_s, server=False)])


def peer_orchestrator(auth_context: dict[str, list[bytes]]) -> int | None:
    """The orchestrator node id the verified client certificate names, or None."""
    names = [*auth_context.get("x509_subject_alternative_name", []), *auth_context.get("x509_common_name", [])]
    for raw in names:
        m = _ORCH.match(raw.decode(errors="replace"))
        if m:
            return int(m.group(1))
    return None


# ---- the model server (docs/distribution.md): the same CA over plain Python ssl ----


def _ssl_context(purpose: ssl.Purpose, secret: bytes, dns_name: str, *, server: bool) -> ssl.SSLContext:
    ca, key, cert = _leaf(secret, dns_name, server=server)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cadata=ca.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED
    # ssl loads a key pair from files only: a private directory that lives for the call.
    with tempfile.TemporaryDirectory(prefix="swactor-tls-") as d:
        key_path, cert_path = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
        for path, data in ((key_path, key), (cert_path, cert)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


def model_server_context(secret: bytes, orchestrator_node_id: int) -> ssl.SSLContext:
    """The orchestrator's model server: serves `orchestrator-<id>.swactor` and requires a client
    certificate from the control CA, so only holders of the cluster secret complete the handshake."""
    return _ssl_context(ssl.Purpose.CLIENT_AUTH, secret, orchestrator_name(orchestrator_node_id), server=True)


def model_client_context(secret: bytes, node_id: int) -> ssl.SSLContext:
    """A node fetching from the model server: presents `node-<id>.swactor`, trusts only the control
    CA; dial with server_hostname=orchestrator_name(<the plan's orchestrator>)."""
    return _ssl_context(ssl.Purpose.SERVER_AUTH, secret, node_name(node_id), server=False)
