"""What a stage asks the weights cache for, and what the fetch reports while it runs (plain data: the
StageController core imports it; the reports are its inputs as they are)."""

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
    # The model's own http(s) URL: the pieces come from here (the manifest always from `url`), and from
    # `url` once the source fails. "" = every piece from `url` (docs/distribution.md "Straight from the source").
    source_url: str = ""


@dataclass(frozen=True)
class FetchStarted:
    bytes_total: int   # the stage's header + tensor bytes
    bytes_cached: int  # already held and verified when the fetch started


@dataclass(frozen=True)
class FetchProgress:
    bytes_done: int
    bytes_total: int
    rate_bps: int
    eta_s: float
