"""The loss-tolerant congestion controller: what it does on a loss with and without a queue, as a pure object, and what
it delivers through two real aioquic connections over a simulated lossy or congested link (linksim.py)."""

from __future__ import annotations

import pytest
from aioquic.quic.congestion.base import K_MINIMUM_WINDOW, create_congestion_control
from aioquic.quic.packet_builder import QuicSentPacket

from swactor.edge import congestion as cc
from swactor.edge.config import EdgeConfig

from .linksim import LinkSpec, transfer

MDS = 1200


def packet(sent: float, size: int = MDS) -> QuicSentPacket:
    return QuicSentPacket(epoch=3, in_flight=True, is_ack_eliciting=True, is_crypto_packet=False, packet_number=0,
                          packet_type=0, sent_bytes=size, sent_time=sent)


def controller(min_rtt: float, recent_rtt: float, window: int = 100 * MDS) -> cc.LossTolerantCongestionControl:
    """Out of slow start with `window`, having measured `min_rtt` then `recent_rtt` (four times)."""
    c = create_congestion_control(cc.CONGESTION_CONTROL, max_datagram_size=MDS)
    assert isinstance(c, cc.LossTolerantCongestionControl)
    c.on_rtt_measurement(now=0.0, rtt=min_rtt)
    for k in range(cc.RECENT_SAMPLES):
        c.on_rtt_measurement(now=0.01 * (k + 1), rtt=recent_rtt)
    c.congestion_window = c.ssthresh = window
    return c


def test_a_loss_without_a_queue_keeps_the_window() -> None:
    c = controller(min_rtt=0.100, recent_rtt=0.104)  # 4 ms over 100: no queue (under a quarter of the RTT)
    c.on_packets_lost(now=1.0, packets=[packet(0.9)])
    assert c.congestion_window == 100 * MDS and c.random_losses == 1 and c.congestion_cuts == 0


def test_a_loss_with_a_queue_halves_the_window_once_per_round_trip() -> None:
    c = controller(min_rtt=0.100, recent_rtt=0.140)  # 40 ms of queueing
    c.on_packets_lost(now=1.0, packets=[packet(0.9)])
    assert c.congestion_window == 50 * MDS and c.congestion_cuts == 1
    c.on_packets_lost(now=1.05, packets=[packet(0.95)])  # sent before the cut: the same event
    assert c.congestion_window == 50 * MDS
    c.on_packets_lost(now=1.2, packets=[packet(1.1)])
    assert c.congestion_window == 25 * MDS and c.congestion_cuts == 2


def test_one_delayed_ack_is_not_a_queue() -> None:
    """The least of the recent RTTs counts: one sample 60 ms late (an ack the peer held) among fast ones is no queue."""
    c = controller(min_rtt=0.100, recent_rtt=0.101)
    c.on_rtt_measurement(now=0.5, rtt=0.160)
    assert c.queueing_s() == pytest.approx(0.001) and not c.queue_building()


def test_many_losses_without_a_queue_are_congestion_all_the_same() -> None:
    """A policer drops without queueing: once more than LOSS_TOLERATED of the recent packets were lost, losses cut."""
    c = controller(min_rtt=0.100, recent_rtt=0.100)
    t = 1.0
    while c.loss_share <= cc.LOSS_TOLERATED:
        for _ in range(9):
            c.on_packet_acked(now=t, packet=packet(t - 0.1))
        c.on_packets_lost(now=t, packets=[packet(t - 0.05)])
        t += 0.2
    assert c.congestion_window < 100 * MDS and c.congestion_cuts >= 1


def test_the_lan_s_jitter_is_not_a_queue_and_persistent_congestion_is_an_outage() -> None:
    c = controller(min_rtt=0.0002, recent_rtt=0.0015)  # 1.3 ms over 0.2: under QUEUE_FLOOR_S
    assert not c.queue_building()
    c.on_persistent_congestion()
    assert c.congestion_window == K_MINIMUM_WINDOW * MDS


def test_slow_start_grows_by_what_is_acked_and_ends_at_the_first_loss() -> None:
    c = create_congestion_control(cc.CONGESTION_CONTROL, max_datagram_size=MDS)
    start = c.congestion_window
    c.on_packet_sent(packet=packet(0.01))
    c.on_packet_acked(now=0.1, packet=packet(0.01))
    assert c.congestion_window == start + MDS and c.bytes_in_flight == 0 and c.ssthresh is None
    c.on_rtt_measurement(now=0.1, rtt=0.1)
    c.on_packets_lost(now=0.2, packets=[packet(0.15)])
    assert c.ssthresh == c.congestion_window == start + MDS  # kept, but probing by doubling is over


def test_the_config_names_the_algorithms_it_takes() -> None:
    assert EdgeConfig(congestion_control="loss_tolerant").congestion_control == "loss_tolerant"
    with pytest.raises(ValueError, match="congestion_control must be one of reno, cubic, loss_tolerant, got 'bbr'"):
        EdgeConfig(congestion_control="bbr")


def test_prompt_chunks_over_a_lossy_link_keep_pace_where_reno_falls_behind() -> None:
    """Eight 150 KB chunks, one every 0.45 s, at 50 ms one way and 2 % loss (a 512-token prefill's activations): every
    byte arrives with either controller; Reno's window collapses at the losses and each chunk waits on the last, the
    loss-tolerant one keeps a window that carries a chunk in a few round trips."""
    link = LinkSpec(delay_s=0.05, loss=0.02)
    reno = transfer("reno", link, objects=8, object_bytes=150_000, gap_s=0.45)
    ours = transfer(cc.CONGESTION_CONTROL, link, objects=8, object_bytes=150_000, gap_s=0.45)
    assert reno.finished and ours.finished and ours.dropped_random > 5
    assert ours.log["congestion_cuts"] == 0 and ours.log["random_losses"] > 5
    assert max(ours.done_s) < 1.0 < max(reno.done_s)  # virtual seconds: deterministic, not a timing of this box
    assert ours.cwnd_bytes > 2 * reno.cwnd_bytes


def test_a_bottleneck_s_queue_still_halves_the_window_as_reno_does() -> None:
    """8 MB through 20 Mbit/s with a 100 KB drop-tail queue: the queue's losses come with a longer round trip, so the
    controller backs off like Reno (the same cuts, the same time) instead of keeping the queue full."""
    link = LinkSpec(delay_s=0.05, rate_bps=20e6, queue_bytes=100_000)
    reno = transfer("reno", link, objects=1, object_bytes=8_000_000)
    ours = transfer(cc.CONGESTION_CONTROL, link, objects=1, object_bytes=8_000_000)
    assert ours.finished and ours.log["congestion_cuts"] >= 1 and ours.log["random_losses"] == 0
    assert ours.dropped_queue <= reno.dropped_queue
