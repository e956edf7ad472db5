"""Anti-entropy digests: exact round trips, refusal of malformed bytes, and repair of lost
messages between pure flood states, without any model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.protocol.antientropy import (
    MAX_GAP_BYTES,
    Digest,
    decode_digest,
    digest_of,
    digest_of_pending,
    encode_digest,
)
from seedflood.protocol.flooding import FloodState
from seedflood.protocol.messages import CodecError, Message
from seedflood.sim.faults import FaultyNetwork, LinkFaults
from seedflood.sim.repair import AntiEntropy
from seedflood.topology import make_topology

digests = st.integers(0, 20).flatmap(
    lambda n: st.builds(
        Digest,
        st.tuples(*[st.integers(0, 10**6)] * n),
        st.tuples(*[st.integers(0, (1 << 200) - 1)] * n),
    )
)


@given(digests)
@settings(max_examples=500)
@pytest.mark.slow
def test_digest_round_trips_exactly(digest: Digest) -> None:
    data = encode_digest(digest)
    assert decode_digest(data) == digest
    assert encode_digest(decode_digest(data)) == data


@given(st.binary(max_size=64))
@settings(max_examples=3000)
def test_arbitrary_bytes_decode_or_are_refused_with_codec_error(data: bytes) -> None:
    try:
        digest = decode_digest(data)
    except CodecError as error:
        assert str(error)
    else:
        assert encode_digest(digest) == data


def test_sixteen_origins_in_step_cost_36_bytes() -> None:
    digest = Digest((1000,) * 16, (0,) * 16)
    assert len(encode_digest(digest)) == 36


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty digest"),
        (b"\x02\x00\x00", "unsupported digest version 2"),
        (b"\x01\xff\xff\xff\xff\x0f\x00", "more than"),
        (b"\x01\x40\x00\x00\x00", "only 2 bytes follow"),
        (b"\x01\x01\x00\x00\x05\x01", "gap of 5 bytes"),
        (b"\x01\x01\x00\x00\x01\x00", "ends in a zero byte"),
        (b"\x01\x01\x00\x00\x00\x07", "1 trailing bytes"),
        (b"\x01\x01\x03\x01\x00", "not the smallest"),
        (b"\x01\x00\x05", "not canonical"),
        (b"\x01\x01\x00\x80\x80", "truncated varint"),
    ],
)
def test_malformed_digests_are_refused_by_name(data: bytes, problem: str) -> None:
    with pytest.raises(CodecError, match=problem):
        decode_digest(data)


def test_a_huge_gap_length_is_refused_before_any_allocation() -> None:
    data = b"\x01\x01\x00\x00" + bytes([0x80, 0x80, 0x80, 0x80, 0x01])
    with pytest.raises(CodecError, match=f"gap of {1 << 28} bytes, but at most 0 fit"):
        decode_digest(data)
    assert MAX_GAP_BYTES < 1 << 28


def test_digest_of_a_flood_state_names_holes() -> None:
    state = FloodState(0, [1])
    for step, origin in [(0, 0), (1, 0), (2, 0), (4, 0), (6, 0), (0, 1), (2, 2)]:
        state.receive(1, [Message(step, origin, 1.0)])
    digest = digest_of(state, 3)
    assert digest == Digest((3, 1, 0), (0b101, 0, 0b10))
    assert [digest.held(step) for step in range(7)] == [0b011, 0b001, 0b101, 0, 0b001, 0, 0b001]
    state.forget_before(2)
    assert digest_of(state, 3) == Digest((3, 2, 3), (0b101, 0, 0))


def test_repair_delivers_what_loss_dropped_and_counts_its_bytes_apart() -> None:
    ring = make_topology("ring", 6)
    network = FaultyNetwork(ring.neighbors, LinkFaults(loss=0.5, seed=4))
    floods = [FloodState(i, ring.neighbors[i]) for i in range(6)]
    pending = {0: {i: Message(0, i, float(i)) for i in range(6)}}
    for message in pending[0].values():
        floods[message.origin].originate(message)
    for _ in range(3):
        outboxes = {s.me: box for s in floods if (box := s.take_outbox())}
        for receiver, packets in network.hop(outboxes).items():
            for sender, messages in packets:
                floods[receiver].receive(sender, messages)
    repair = AntiEntropy(ring, local_steps=1, hops=3)
    lacking = sum(repair.missing(floods, pending, 0))
    assert lacking > 0
    exchanges = repair.repair(floods, pending, network, 0, limit=64)
    assert all(state.held(0) == 0b111111 for state in floods)
    assert repair.repaired == lacking and 1 <= exchanges <= 64
    assert repair.summary()["repair_bytes_per_edge_max"] > 0
    assert network.counter.summary()["bytes_total"] > 0
    assert repair.describe()["full_delivery_round"] == 0


def test_repair_respects_the_flooding_schedule() -> None:
    """With one hop per round, a message two hops away is not due in its own round, so repair
    leaves it alone even though a neighbour holds it."""
    ring = make_topology("ring", 6)
    floods = [FloodState(i, ring.neighbors[i]) for i in range(6)]
    message = Message(0, 0, 1.0)
    floods[0].originate(message)
    floods[1].receive(0, [message])
    repair = AntiEntropy(ring, local_steps=1, hops=1)
    network = FaultyNetwork(ring.neighbors, LinkFaults())
    assert repair.missing(floods, {0: {0: message}}, 0)[5] == 1
    repair.repair(floods, {0: {0: message}}, network, 0, limit=8)
    assert [state.held(0) for state in floods] == [1, 1, 0, 0, 0, 1]


def test_a_real_peers_digest_covers_its_committed_prefix_and_pending_holes() -> None:
    held = {5: {0: Message(5, 0, 1.0), 2: Message(5, 2, 1.0)}, 7: {1: Message(7, 1, 1.0)}}
    digest = digest_of_pending(4, held, 3)
    assert digest == Digest((6, 5, 6), (0, 0b10, 0))
    assert [digest.held(step) for step in (4, 5, 6, 7)] == [0b111, 0b101, 0, 0b010]
    assert decode_digest(encode_digest(digest)) == digest
