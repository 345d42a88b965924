"""Structured events: one JSON object per line on stderr, carrying the spec's identities (§40).

Services emit events with stable names and reason enums; tests assert on those events
(structlog.testing.capture_logs), never on free-form text. Payload bytes never go here.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_configured = False


def configure_logging(service: str, *, level: int = logging.INFO, **identities: Any) -> None:
    """Route every event of this process to stderr as JSON, stamped with the service name.

    Idempotent; `identities` (e.g. node_id) are bound into every event of the process.
    """
    global _configured
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per event (message and newline together): a service and its children share one pipe under
        # the host supervisor (and one journal stream under systemd), and writes of up to PIPE_BUF bytes do not
        # interleave; PrintLogger writes the newline separately.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, **identities)
    _configured = True


def get_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger whose events carry `bound` identities (run_id=..., edge_id=..., ...).

    The logger stays lazy until its first event, so one made at import time still follows a
    `configure_logging` that runs later.
    """
    return structlog.get_logger(**bound)
