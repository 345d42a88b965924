"""What a stage asks the weights cache for (plain data: the StageController core imports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FetchRequest:
    url: str
    sha256: str
    size: int
    manifest_sha256: str
    layer_start: int
    layer_end: int
    num_layers: int
    # The TLS name the server must present (the model server: orchestrator-<id>.swactor).
    tls_name: str = ""
