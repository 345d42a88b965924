"""The link model without packets (linkconditions.py, linkschedule.py, linkshaping.py's rules and readiness, the
delayer's NFQUEUE message parsing): the ranges, when each packet goes, a rate-capped path's buffer, one flow never
overtaking itself."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import pytest

from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkschedule import BUFFER_MIN_PACKETS, MTU_BYTES, LinkSchedule
from swactor.localcluster.linkshaping import QUEUE_NUM, _delayer_ready, delayer_argv, rules_script
from swactor.localcluster.nfqueue import NFQA_CAP_LEN, NFQA_PACKET_HDR, NFQA_PAYLOAD, flow_of, parse_packet
from swactor.localcluster.procs import Service
from swactor.localcluster.ready import NotReady

A = (17, b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", 7400, 7400)
B = (6, b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", 40000, 7442)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"delay_ms": -1}, "delay_ms must be in [0, 10000], got -1"),
    ({"delay_ms": 10001}, "delay_ms must be in [0, 10000]"),
    ({"delay_ms": 40, "jitter_ms": 41}, "jitter_ms must be in [0, delay_ms 40], got 41"),
    ({"jitter_ms": 1}, "jitter_ms must be in [0, delay_ms 0]"),
    ({"loss_pct": 100.5}, "loss_pct must be in [0, 100], got 100.5"),
    ({"loss_pct": math.nan}, "loss_pct must be a finite number"),
    ({"rate_mbit": 0.0}, "rate_mbit must be in (0, 100000], got 0"),
    ({"rate_mbit": math.inf}, "rate_mbit must be a finite number"),
])
def test_conditions_out_of_range_are_refused_by_name(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        LinkConditions(**kwargs)
    assert needle in str(e.value)


def test_what_each_condition_needs_and_how_it_reads() -> None:
    assert not LinkConditions().shaped
    loss = LinkConditions(loss_pct=2.5)
    assert loss.shaped and not loss.needs_delayer  # a kernel rule only
    assert LinkConditions(rate_mbit=10).needs_delayer and LinkConditions(delay_ms=1).needs_delayer
    text = LinkConditions(delay_ms=40, jitter_ms=5, loss_pct=1, rate_mbit=10).describe()
    assert text == ("one-way delay 40 ms ± 5 ms, loss 1 %, rate 10 Mbit/s, on every packet a host sends to "
                    "another host (each one-way path alike)")
    assert "--rate-mbit" not in delayer_argv(LinkConditions(delay_ms=40))
    assert delayer_argv(LinkConditions(rate_mbit=2.5))[-2:] == ["--rate-mbit", "2.5"]


def test_the_rules_queue_what_needs_the_delayer_and_drop_loss_on_arrival() -> None:
    only_loss = rules_script(LinkConditions(loss_pct=50))
    assert "NFQUEUE" not in only_loss
    assert "-A INPUT -i eth0 -j SWACTOR-WAN\n" in only_loss  # on arrival: the sender has let go of the packet
    assert "-A SWACTOR-WAN -m statistic --mode random --probability 0.5000000000 -j DROP" in only_loss
    both = rules_script(LinkConditions(delay_ms=40, loss_pct=0.25))
    assert both.index("--probability 0.0025000000 -j DROP") < both.index(f"-j NFQUEUE --queue-num {QUEUE_NUM}\n")
    assert "--queue-bypass" not in both  # fail closed


def test_a_kept_log_from_an_earlier_run_is_no_evidence_that_a_delayer_is_ready(tmp_path: Path) -> None:
    log = tmp_path / "link-delay.log"
    log.write_text('{"event": "link_delay_ready"}\n{"event": "link_delay_stopped"}\n')  # a kept --dir's last run
    since = log.stat().st_size
    svc = Service("h0/link-delay", [], log)
    with pytest.raises(NotReady):
        _delayer_ready(svc, since)
    with log.open("a") as f:
        f.write('{"event": "link_delay_ready"}\n')
    _delayer_ready(svc, since)


def test_delay_alone_holds_every_packet_the_delay_in_arrival_order() -> None:
    s = LinkSchedule(LinkConditions(delay_ms=40))
    times = [s.admit(t, 1500, A if t % 2 else B) for t in (0.0, 0.001, 0.002, 0.5)]
    assert times == pytest.approx([0.04, 0.041, 0.042, 0.54])


def test_jitter_draws_within_the_range_and_one_flow_never_overtakes_itself() -> None:
    s = LinkSchedule(LinkConditions(delay_ms=40, jitter_ms=20), random.Random(7))
    a = [s.admit(i * 0.0001, 100, A) for i in range(500)]  # a burst: 50 ms of packets 0.1 ms apart
    b = [s.admit(i * 0.0001 + 0.00005, 100, B) for i in range(500)]
    assert all(x is not None for x in a + b)
    assert a == sorted(a) and b == sorted(b)
    assert all(0.02 <= t - i * 0.0001 <= 0.06 + 1e-9 for i, t in enumerate(a))  # type: ignore[operator]
    # across flows there is no order: some packet of B goes before an earlier packet of A
    assert any(tb < ta for ta, tb in zip(a, b, strict=True))  # type: ignore[operator]


def test_a_rate_serializes_each_paths_packets_and_drops_what_overflows_its_buffer() -> None:
    s = LinkSchedule(LinkConditions(delay_ms=10, rate_mbit=1.0))  # 125 000 bytes/s: 12 ms per 1500-byte packet
    assert s.buffer_bytes == BUFFER_MIN_PACKETS * MTU_BYTES  # 0.1 s at the rate is only 12 500 bytes
    got = [s.admit(0.0, 1500, A) for _ in range(BUFFER_MIN_PACKETS + 3)]
    sent = [t for t in got if t is not None]
    assert len(sent) == BUFFER_MIN_PACKETS and got[BUFFER_MIN_PACKETS:] == [None] * 3
    assert sent[:3] == pytest.approx([0.012 + 0.01, 0.024 + 0.01, 0.036 + 0.01])
    # another host's path is not behind this one's backlog
    other = (17, b"\x0a\x00\x00\x03", b"\x0a\x00\x00\x02", 7400, 7400)
    assert s.admit(0.0, 1500, other) == pytest.approx(0.022)
    # once the path drained, it takes packets again
    assert s.admit(1.0, 1500, B) == pytest.approx(1.022)


def test_the_flow_table_forgets_flows_with_nothing_held() -> None:
    s = LinkSchedule(LinkConditions(delay_ms=5, jitter_ms=5), random.Random(1))
    held = [(s.admit(0.0, 100, (17, b"", b"", port, 1)), port) for port in range(100)]
    for at, port in sorted(held, key=lambda h: h[0] or 0.0):
        assert at is not None
        s.released((17, b"", b"", port, 1), at)
    assert s._flow_last == {}


def _attr(kind: int, data: bytes) -> bytes:  # a netlink attribute, padded to 4 bytes
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + bytes(-len(raw) % 4)


def test_a_queued_packet_message_gives_its_id_length_and_flow() -> None:
    ip = bytes([0x45, 0, 0x05, 0xDC]) + bytes(5) + bytes([17]) + bytes(2) + bytes([10, 0, 0, 1, 10, 0, 0, 2])
    ip += struct.pack("!HH", 7400, 7401)
    msg = (struct.pack("=BBH", 2, 0, 0) + _attr(NFQA_PACKET_HDR, struct.pack("!IHB", 77, 0x0800, 3))
           + _attr(NFQA_PAYLOAD, ip) + _attr(NFQA_CAP_LEN, struct.pack("!I", 1500)))
    p = parse_packet(msg)
    assert p is not None and (p.packet_id, p.length) == (77, 1500)
    assert p.flow == (17, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 7400, 7401)
    assert flow_of(b"\x60" + bytes(40)) == (0, b"", b"", 0, 0)  # not IPv4: one shared flow
