"""Gossiped metadata tags, GPU inventory flags, the cluster secret and its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.common.secret import SecretError, gossip_key, read_secret
from swactor.membership.gpus import (
    compute_device,
    detect_nvidia,
    host_memory_available,
    nvidia_memory,
    parse_gpu,
)
from swactor.membership.metadata import (
    MetadataError,
    check_endpoint,
    check_fingerprint,
    decode_tags,
    encode_tags,
)
from swactor.v1 import membership_pb2 as pb


def full() -> pb.NodeMetadata:
    return pb.NodeMetadata(
        node_id=2**63 - 1,
        software_version="0.1.0",
        edge_endpoint="10.0.0.7:4433",
        edge_cert_fingerprint="ab" * 32,
        control_endpoint="10.0.0.7:7000",
        gpus=[pb.GpuDevice(kind="CUDA", name="NVIDIA H200", memory_bytes=150754820096)] * 8
        + [pb.GpuDevice(kind="CPU", name="host", memory_bytes=0)],
        state=pb.NODE_STATE_FAULTED,
        state_reason="RUN_FAULT_WORKER_CRASHED",
        stage_memory_bytes=141 * 2**30,
    )


def test_round_trip_and_gpu_grouping_fit_the_gossip_budget() -> None:
    md = full()
    tags = encode_tags(md)
    assert tags["gpu"].startswith("8*CUDA|NVIDIA H200|150754820096;")
    assert decode_tags(tags) == md


def test_empty_optional_fields_are_not_sent() -> None:
    tags = encode_tags(pb.NodeMetadata(node_id=5, software_version="1", state=pb.NODE_STATE_BOOTING))
    assert tags == {"id": "5", "v": "1", "st": "booting"}


def test_oversized_metadata_is_refused_by_name() -> None:
    md = full()
    md.gpus.extend(pb.GpuDevice(kind="CUDA", name=f"gpu-{i}", memory_bytes=i) for i in range(40))
    with pytest.raises(MetadataError, match="512"):
        encode_tags(md)


def test_separator_characters_in_gpu_names_are_refused() -> None:
    with pytest.raises(MetadataError, match="GPU"):
        encode_tags(pb.NodeMetadata(gpus=[pb.GpuDevice(kind="CUDA", name="a|b")]))


def test_malformed_peer_tags_are_left_empty_not_trusted() -> None:
    md = decode_tags({"id": "x", "gpu": "garbage", "st": "weird", "mem": "lots"}, fallback_node_id=9)
    assert md.node_id == 9 and list(md.gpus) == [] and md.state == pb.NODE_STATE_UNSPECIFIED
    assert md.stage_memory_bytes == 0 and decode_tags({"mem": "-5"}).stage_memory_bytes == 0


@pytest.mark.parametrize("bad", ["nohost", "host:", "host:99999", "a b:1"])
def test_endpoints_must_be_host_port(bad: str) -> None:
    with pytest.raises(MetadataError, match=r"host:port|port"):
        check_endpoint("edge_endpoint", bad)


def test_fingerprint_accepts_colon_hex_and_refuses_the_rest() -> None:
    assert check_fingerprint(":".join(["AB"] * 32)) == "ab" * 32
    with pytest.raises(MetadataError, match="64 hex"):
        check_fingerprint("abc")


def test_gpu_flag_parsing() -> None:
    assert parse_gpu("CUDA:NVIDIA H200:1024") == pb.GpuDevice(kind="CUDA", name="NVIDIA H200", memory_bytes=1024)
    assert parse_gpu("NV:a:b:5").name == "a:b"
    for bad in ["CUDA", "CUDA:x", "CUDA:x:lots", "CUDA:x:-1"]:
        with pytest.raises(ValueError, match="GPU"):
            parse_gpu(bad)


def test_secret_file_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="does not exist"):
        read_secret(tmp_path / "missing")
    short = tmp_path / "short"
    short.write_text("tiny\n")
    with pytest.raises(SecretError, match="at least 16"):
        read_secret(short)
    with pytest.raises(SecretError, match="--secret-file"):
        read_secret(None)
    ok = tmp_path / "ok"
    ok.write_text("  a perfectly long cluster secret \n")
    assert read_secret(ok) == b"a perfectly long cluster secret"


def test_gossip_key_depends_on_secret_and_cluster() -> None:
    k = gossip_key(b"s" * 32, "swactor")
    assert len(k) == 32 and k == gossip_key(b"s" * 32, "swactor")
    assert k != gossip_key(b"t" * 32, "swactor")
    assert k != gossip_key(b"s" * 32, "other")


def test_nvidia_smi_inventory_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf 'NVIDIA H200, 143771\\nNVIDIA H200, 143771\\nbroken line\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_nvidia() == [pb.GpuDevice(kind="CUDA", name="NVIDIA H200", memory_bytes=143771 * 2**20)] * 2
    assert compute_device("") == "CUDA" and compute_device("CPU") == "CPU"  # CUDA, not tinygrad's NV: Hopper
    fake.write_text("#!/bin/sh\nexit 9\n")
    assert detect_nvidia() == [] and compute_device("") == "CPU" and compute_device("CUDA:1") == "CUDA:1"


def test_device_memory_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$1\" in --query-gpu=index,memory.total,memory.free) "
                    "printf '0, 143771, 100000\\n1, 143771, 5000\\n' ;; *) exit 3 ;; esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_memory(1) == (143771 * 2**20, 5000 * 2**20) and nvidia_memory(0)[1] == 100000 * 2**20
    assert nvidia_memory(2) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:          100 kB\nMemAvailable:   12000000 kB\n")
    assert host_memory_available(meminfo) == 12000000 * 1024
    assert host_memory_available(tmp_path / "none") == 0 and host_memory_available(Path("/proc/meminfo")) > 0


def test_edge_certificate_fingerprint_is_sha256_of_the_der(tmp_path: Path) -> None:
    import datetime
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from swactor.common.config import ConfigError
    from swactor.membership.main import certificate_fingerprint

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    der = cert.public_bytes(serialization.Encoding.DER)
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "c.der").write_bytes(der)
    (tmp_path / "junk").write_bytes(b"not a certificate")
    expected = hashlib.sha256(der).hexdigest()
    assert certificate_fingerprint(tmp_path / "c.pem") == expected
    assert certificate_fingerprint(tmp_path / "c.der") == expected
    with pytest.raises(ConfigError, match="not a PEM or DER"):
        certificate_fingerprint(tmp_path / "junk")
    with pytest.raises(ConfigError, match="edge certificate"):
        certificate_fingerprint(tmp_path / "missing.pem")
