"""The worker generation in gossip (issue 12): the worker reports it with its state, peers decode it,
a malformed value is dropped rather than trusted."""

from __future__ import annotations

from swactor.membership.metadata import decode_tags, encode_tags
from swactor.v1 import membership_pb2 as pb


def test_worker_generation_round_trips_and_zero_is_not_sent() -> None:
    md = pb.NodeMetadata(node_id=5, software_version="1", state=pb.NODE_STATE_AVAILABLE, worker_generation=3)
    tags = encode_tags(md)
    assert tags["wg"] == "3" and decode_tags(tags) == md
    assert "wg" not in encode_tags(pb.NodeMetadata(node_id=5, software_version="1"))


def test_a_malformed_worker_generation_is_left_zero() -> None:
    for bad in ("x", "-4", ""):
        assert decode_tags({"id": "5", "v": "1", "st": "available", "wg": bad}).worker_generation == 0
