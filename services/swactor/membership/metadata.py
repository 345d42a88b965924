"""Gossiped node metadata (NodeMetadata) as the short string tags SWIM carries.

The engine limits encoded tags to 512 bytes, so keys are one or two letters and identical GPUs
are run-length grouped ("8*CUDA|NVIDIA H200|150754820096"). Decoding is lenient about what it
does not know (a newer peer's extra tags) and strict about malformed values it does.
"""

from __future__ import annotations

import contextlib
import re

from swactor.v1 import membership_pb2 as pb

MAX_TAG_BYTES = 512
# The most stage devices (GPUs) a node advertises: a bound on what one host is planned to carry.
MAX_STAGE_DEVICES = 64

_STATE_TAGS = {
    pb.NODE_STATE_BOOTING: "booting",
    pb.NODE_STATE_AVAILABLE: "available",
    pb.NODE_STATE_FAULTED: "faulted",
}
_TAG_STATES = {v: k for k, v in _STATE_TAGS.items()}
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")
_ENDPOINT_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-_]+):\d{1,5}$")


class MetadataError(ValueError):
    """A metadata value is malformed or the encoded tags do not fit."""


def check_endpoint(what: str, value: str) -> str:
    if value and not _ENDPOINT_RE.match(value):
        raise MetadataError(f"{what} must be host:port, got {value!r}")
    if value and not 0 < int(value.rsplit(":", 1)[1]) < 65536:
        raise MetadataError(f"{what} port out of range in {value!r}")
    return value


def check_fingerprint(value: str) -> str:
    value = value.lower().replace(":", "")
    if value and not _FINGERPRINT_RE.match(value):
        raise MetadataError(f"edge certificate fingerprint must be 64 hex digits (SHA-256), got {value!r}")
    return value


def check_stage_devices(value: int) -> int:
    if not 0 <= value <= MAX_STAGE_DEVICES:
        raise MetadataError(f"stage_devices must be 0..{MAX_STAGE_DEVICES}, got {value}")
    return value


def _encode_gpus(gpus: list[pb.GpuDevice]) -> str:
    groups: list[tuple[int, str]] = []
    for g in gpus:
        for field_ in (g.kind, g.name):
            if any(c in field_ for c in "|;*"):
                raise MetadataError(f"GPU kind/name may not contain '|', ';' or '*': {field_!r}")
        one = f"{g.kind}|{g.name}|{g.memory_bytes}"
        if groups and groups[-1][1] == one:
            groups[-1] = (groups[-1][0] + 1, one)
        else:
            groups.append((1, one))
    return ";".join(one if n == 1 else f"{n}*{one}" for n, one in groups)


def _decode_gpus(text: str) -> list[pb.GpuDevice]:
    out: list[pb.GpuDevice] = []
    for group in filter(None, text.split(";")):
        count_text, _, one = group.rpartition("*")
        count = int(count_text) if count_text else 1
        kind, name, memory = one.split("|")
        out.extend(pb.GpuDevice(kind=kind, name=name, memory_bytes=int(memory)) for _ in range(count))
    return out


def encode_tags(md: pb.NodeMetadata) -> dict[str, str]:
    tags = {
        "id": str(md.node_id),
        "v": md.software_version,
        "st": _STATE_TAGS.get(md.state, "booting"),
    }
    optional = {
        "edge": md.edge_endpoint,
        "fp": md.edge_cert_fingerprint,
        "ctl": md.control_endpoint,
        "gpu": _encode_gpus(list(md.gpus)),
        "why": md.state_reason,
        "wg": str(md.worker_generation) if md.worker_generation else "",
        "mem": str(md.stage_memory_bytes) if md.stage_memory_bytes else "",
        "dev": str(md.stage_devices) if md.stage_devices > 1 else "",
        "spl": str(md.step_us_per_layer) if md.step_us_per_layer else "",
    }
    tags.update({k: v for k, v in optional.items() if v})
    size = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in tags.items())
    if size > MAX_TAG_BYTES:
        raise MetadataError(f"node metadata encodes to {size} bytes; gossip carries at most {MAX_TAG_BYTES}")
    return tags


def decode_tags(tags: dict[str, str] | None, fallback_node_id: int = 0) -> pb.NodeMetadata:
    """NodeMetadata from a peer's tags; a malformed field is left empty rather than trusted."""
    tags = dict(tags or {})
    md = pb.NodeMetadata(
        software_version=tags.get("v", ""),
        edge_endpoint=tags.get("edge", ""),
        edge_cert_fingerprint=tags.get("fp", ""),
        control_endpoint=tags.get("ctl", ""),
        state=_TAG_STATES.get(tags.get("st", ""), pb.NODE_STATE_UNSPECIFIED),
        state_reason=tags.get("why", ""),
    )
    try:
        md.node_id = int(tags.get("id", fallback_node_id))
    except ValueError:
        md.node_id = fallback_node_id
    with contextlib.suppress(ValueError):
        md.gpus.extend(_decode_gpus(tags.get("gpu", "")))
    with contextlib.suppress(ValueError):
        md.worker_generation = max(0, int(tags.get("wg", "0")))
        md.stage_memory_bytes = max(0, min(int(tags.get("mem", 0)), 2**64 - 1))
    with contextlib.suppress(ValueError):
        md.stage_devices = max(0, min(int(tags.get("dev", 0)), MAX_STAGE_DEVICES))
    with contextlib.suppress(ValueError):
        md.step_us_per_layer = max(0, min(int(tags.get("spl", 0)), 2**32 - 1))
    return md
