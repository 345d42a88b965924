"""Receive-credit policy (spec §35): QUIC stream credit follows ring consumption.

Pure functions. A recv-pump tracks `delivered`, the stream offset up to which bytes have been
written into the ingress ring. The credit (MAX_STREAM_DATA) it may grant is

    delivered + min(ring_free, window)

so the peer can never send more than the ring can absorb right now (bytes in flight land in
free ring space), capped by `window`, which bounds what one edge can hold in driver memory.
As the worker consumes, ring_free grows and so does the credit; a stalled worker stalls the
remote sender once its credit is used up. Updates are batched: a new limit is announced only
when it moves by at least a quarter window, or when the sender is close to blocking.
"""

from __future__ import annotations


def credit_limit(delivered: int, ring_free: int, window: int) -> int:
    """Highest stream offset the peer may send up to."""
    return delivered + max(0, min(ring_free, window))


def next_announcement(
    *, delivered: int, ring_free: int, window: int, announced: int, received: int
) -> int | None:
    """The new MAX_STREAM_DATA to announce, or None when the current one is good enough.

    `announced` is the limit the peer knows; `received` the highest offset it has sent.
    Credit never shrinks (QUIC forbids it).
    """
    limit = credit_limit(delivered, ring_free, window)
    if limit <= announced:
        return None
    headroom = announced - received  # what the sender can still send without an update
    if limit - announced >= max(1, window // 4) or headroom < window // 2:
        return limit
    return None
