"""The simulated transport: exact byte accounting per edge and what receivers get."""

import math

import pytest

from seedflood.protocol.flooding import FloodState, flood
from seedflood.protocol.messages import CodecError, Message, encode_packet, quantize
from seedflood.protocol.traffic import EdgeTraffic
from seedflood.sim.network import SimulatedNetwork

PATH = [[1], [0, 2], [1, 3], [2]]  # 0 - 1 - 2 - 3


def test_bytes_on_an_edge_are_the_packets_that_crossed_it() -> None:
    network = SimulatedNetwork(PATH, "fp16")
    first = {1: {0: [Message(3, 1, 0.1)], 2: [Message(s, 1, 1.0) for s in range(5)]}}
    second = {1: {0: [Message(4, 1, 0.2), Message(4, 2, 0.3)]}, 2: {1: [Message(4, 2, 0.3)]}}
    network.hop(first)
    network.hop(second)
    sent_to_0 = [first[1][0], second[1][0]]
    expected_bytes = sum(len(encode_packet(ms, "fp16")) for ms in sent_to_0)
    assert expected_bytes == (2 + 2 + 2) + (2 + 2 + 2 + 2 + 2)
    assert network.traffic[(1, 0)] == EdgeTraffic(
        bytes=expected_bytes, messages=3, packets=2, header_bytes=expected_bytes - 3 * 2
    )
    assert network.traffic[(1, 2)] == EdgeTraffic(
        bytes=2 + 2 + 10, messages=5, packets=1, header_bytes=4
    )
    assert network.traffic[(2, 1)].bytes == len(encode_packet(second[2][1], "fp16")) == 6
    assert network.traffic[(0, 1)] == EdgeTraffic()


def test_summary_adds_both_directions_of_each_edge() -> None:
    network = SimulatedNetwork(PATH)
    network.hop({1: {0: [Message(0, 1, 1.0)], 2: [Message(0, 1, 1.0)]}})
    network.hop({0: {1: [Message(0, 0, 1.0), Message(1, 0, 1.0)]}})
    # Each packet has a 4-byte header (head, base_step, origin_delta, tail).
    # Edge 0-1: (4 + 4) + (4 + 8) bytes, 3 messages; edge 1-2: 4 + 4 bytes; edge 2-3: nothing.
    assert network.summary() == {
        "bytes_per_edge_max": 20.0,
        "bytes_per_edge_mean": 28 / 3,
        "messages_per_edge_max": 3.0,
        "messages_per_edge_mean": 4 / 3,
        "header_bytes_per_edge_max": 8.0,
        "packets_total": 3.0,
        "bytes_total": 28.0,
    }


def test_receivers_get_what_the_wire_carries_sorted_by_sender() -> None:
    network = SimulatedNetwork(PATH, "bf16")
    deliveries = network.hop(
        {2: {1: [Message(0, 2, 0.1)]}, 0: {1: [Message(1, 0, 3.0), Message(0, 0, math.pi)]}}
    )
    assert deliveries == {
        1: [
            (0, [Message(0, 0, quantize(math.pi, "bf16")), Message(1, 0, 3.0)]),
            (2, [Message(0, 2, quantize(0.1, "bf16"))]),
        ]
    }
    assert quantize(math.pi, "bf16") == 3.140625


def test_a_packet_seen_before_is_delivered_and_counted_as_the_first_time() -> None:
    """Flooding forwards one message hop after hop, and the network remembers each packet's
    encoding and decoding: every later hop must deliver equal, separate lists and count the
    same bytes as the first."""
    network = SimulatedNetwork(PATH, "bf16")
    message = Message(0, 1, math.pi)
    first = network.hop({1: {2: [message]}})
    first[2][0][1].append(Message(9, 9, 0.0))  # a receiver's list is its own
    again = network.hop({2: {3: [message]}, 1: {2: [message]}})
    assert again == {
        2: [(1, [Message(0, 1, quantize(math.pi, "bf16"))])],
        3: [(2, [Message(0, 1, quantize(math.pi, "bf16"))])],
    }
    assert network.traffic[(1, 2)].bytes == 2 * network.traffic[(2, 3)].bytes > 0


def test_empty_lists_send_no_packet() -> None:
    network = SimulatedNetwork(PATH)
    assert network.hop({0: {1: []}, 1: {}}) == {}
    assert network.summary()["packets_total"] == 0.0


def test_a_failing_hop_counts_nothing() -> None:
    network = SimulatedNetwork(PATH)
    outboxes = {0: {1: [Message(0, 0, 1.0)]}, 1: {2: [Message(0, 1, math.nan)]}}
    with pytest.raises(CodecError, match="not finite"):
        network.hop(outboxes)
    with pytest.raises(ValueError, match="client 0 cannot send to 2"):
        network.hop({0: {1: [Message(0, 0, 1.0)], 2: [Message(0, 0, 1.0)]}})
    assert network.summary()["bytes_total"] == 0.0


@pytest.mark.parametrize(
    ("graph", "problem"),
    [
        ([[1], []], "listed by 0 but not by 1"),
        ([[0]], "invalid neighbour 0"),
        ([[2], [0]], "invalid neighbour 2"),
        ([[1, 1], [0]], "twice"),
    ],
)
def test_bad_graphs_are_refused(graph: list[list[int]], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SimulatedNetwork(graph)


def test_bad_format_is_refused() -> None:
    with pytest.raises(ValueError, match="'fp64' is not one of fp32, fp16, bf16"):
        SimulatedNetwork(PATH, "fp64")


def test_traffic_exists_for_every_directed_edge() -> None:
    assert sorted(SimulatedNetwork(PATH).traffic) == [
        (0, 1),
        (1, 0),
        (1, 2),
        (2, 1),
        (2, 3),
        (3, 2),
    ]


def test_flood_stops_when_nothing_is_owed() -> None:
    states = [FloodState(client, PATH[client]) for client in range(4)]
    network = SimulatedNetwork(PATH)
    states[0].originate(Message(0, 0, 1.0))
    received = flood(states, network, hops=10)
    assert [[m.key for m in messages] for messages in received] == [
        [],
        [(0, 0)],
        [(0, 0)],
        [(0, 0)],
    ]
    # 3 hops carry the message down the path; nothing is owed afterwards.
    assert network.summary()["packets_total"] == 3.0
    assert flood(states, network, hops=10) == [[], [], [], []]


def test_flood_refuses_bad_arguments() -> None:
    states = [FloodState(0, [1]), FloodState(0, [1])]
    with pytest.raises(ValueError, match="share one client id"):
        flood(states, SimulatedNetwork([[1], [0]]), hops=1)
    with pytest.raises(ValueError, match="hops must be >= 0"):
        flood(states[:1], SimulatedNetwork([[1], [0]]), hops=-1)
    lonely = FloodState(0, [1])
    lonely.originate(Message(0, 0, 1.0))
    with pytest.raises(ValueError, match="delivered to client 1, not hosted here"):
        flood([lonely], SimulatedNetwork([[1], [0]]), hops=1)
