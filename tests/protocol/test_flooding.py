"""Flooding on real graphs: arrival rounds, exactly-once delivery and exact edge crossings."""

import math
import random
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence

import pytest

from seedflood.protocol.flooding import Deliveries, FloodState, flood
from seedflood.protocol.messages import Message
from seedflood.sim.network import SimulatedNetwork

Graph = list[list[int]]


def ring(n: int) -> Graph:
    return [[(i - 1) % n, (i + 1) % n] for i in range(n)]


def grid(rows: int, cols: int) -> Graph:
    graph: Graph = [[] for _ in range(rows * cols)]
    for r in range(rows):
        for c in range(cols):
            for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                if 0 <= r + dr < rows and 0 <= c + dc < cols:
                    graph[r * cols + c].append((r + dr) * cols + c + dc)
    return graph


def distances(graph: Graph, source: int) -> list[int]:
    dist = [-1] * len(graph)
    dist[source] = 0
    queue = deque([source])
    while queue:
        node = queue.popleft()
        for other in graph[node]:
            if dist[other] < 0:
                dist[other] = dist[node] + 1
                queue.append(other)
    return dist


def random_connected(n: int, p: float, seed: int) -> Graph:
    rng = random.Random(seed)
    while True:
        graph: Graph = [[] for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() < p:
                    graph[i].append(j)
                    graph[j].append(i)
        if min(distances(graph, 0)) >= 0:
            return graph


def diameter(graph: Graph) -> int:
    return max(max(distances(graph, source)) for source in range(len(graph)))


class RecordingNetwork(SimulatedNetwork):
    """Counts how often each message crosses each directed edge."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.crossings: Counter[tuple[int, int, tuple[int, int]]] = Counter()

    def hop(self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]]) -> Deliveries:
        for sender, box in outboxes.items():
            for receiver, messages in box.items():
                self.crossings.update((sender, receiver, m.key) for m in messages)
        return super().hop(outboxes)


def run_rounds(
    graph: Graph, hops_per_round: int, rounds: int
) -> tuple[dict[tuple[int, int], int], list[FloodState], RecordingNetwork]:
    """Every client originates one step-0 message; returns the round each (origin, client) met."""
    states = [FloodState(client, graph[client]) for client in range(len(graph))]
    network = RecordingNetwork(graph)
    for state in states:
        state.originate(Message(0, state.me, state.me + 0.5))
    arrival: dict[tuple[int, int], int] = {}
    for round_number in range(1, rounds + 1):
        for client, messages in enumerate(flood(states, network, hops=hops_per_round)):
            assert messages == sorted(messages)
            for message in messages:
                assert (message.origin, client) not in arrival
                assert message.scalar == message.origin + 0.5
                arrival[(message.origin, client)] = round_number
    return arrival, states, network


GRAPHS = {
    "ring16": ring(16),
    "grid4x4": grid(4, 4),
    "random20": random_connected(20, 0.15, seed=3),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("hops_per_round", [1, 2, 3, None])
def test_messages_arrive_after_ceil_distance_over_k_rounds(
    name: str, hops_per_round: int | None
) -> None:
    graph = GRAPHS[name]
    n, d = len(graph), diameter(graph)
    k = hops_per_round or d
    arrival, states, network = run_rounds(graph, k, rounds=math.ceil(d / k) + 2)
    for origin in range(n):
        dist = distances(graph, origin)
        for client in range(n):
            if client != origin:
                assert arrival[(origin, client)] == math.ceil(dist[client] / k)
    assert len(arrival) == n * (n - 1)
    assert [state.seen_count for state in states] == [n] * n
    assert max(network.crossings.values()) == 1
    crossed = sum(edge.messages for edge in network.traffic.values())
    assert crossed == sum(network.crossings.values())
    assert crossed == n * (n - 1) + sum(state.duplicates_dropped for state in states)
    assert not any(state.take_outbox() for state in states)


def test_with_k_equal_to_diameter_everyone_has_everything_after_one_round() -> None:
    graph = grid(4, 4)
    arrival, _, _ = run_rounds(graph, diameter(graph), rounds=1)
    assert len(arrival) == 16 * 15
    assert set(arrival.values()) == {1}


@pytest.mark.parametrize(("n", "per_message"), [(16, 16), (15, 16), (8, 8)])
def test_ring_crossings_are_exact(n: int, per_message: int) -> None:
    # Even n: the two fronts meet at the antipode in one hop; it keeps the first copy and its
    # pending forward is withdrawn by the second copy, so n/2 crossings each way = n. Odd n: the
    # two fronts reach adjacent clients in one hop and each forwards once across the meeting
    # edge, so (n - 1)/2 + 1 each way = n + 1.
    arrival, states, network = run_rounds(ring(n), 1, rounds=n)
    assert len(arrival) == n * (n - 1)
    assert sum(edge.messages for edge in network.traffic.values()) == n * per_message
    assert {edge.messages for edge in network.traffic.values()} == {per_message // 2}
    assert sum(state.duplicates_dropped for state in states) == n * (per_message - n + 1)


def test_receive_forwards_to_all_but_the_sender_and_drops_duplicates() -> None:
    state = FloodState(0, [1, 2, 3])
    new = state.receive(1, [Message(4, 9, 1.0), Message(2, 7, 2.0), Message(4, 9, 1.0)])
    assert [m.key for m in new] == [(2, 7), (4, 9)]
    assert state.duplicates_dropped == 1
    assert state.seen_count == 2
    outbox = state.take_outbox()
    assert sorted(outbox) == [2, 3]
    assert [m.key for m in outbox[2]] == [(2, 7), (4, 9)]
    assert state.take_outbox() == {}


def test_a_duplicate_withdraws_the_copy_owed_to_its_sender() -> None:
    state = FloodState(0, [1, 2])
    state.receive(1, [Message(0, 5, 1.0)])
    state.receive(2, [Message(0, 5, 1.0)])
    assert state.take_outbox() == {}
    assert state.duplicates_dropped == 1


def test_originate_queues_for_every_neighbour() -> None:
    state = FloodState(3, [2, 4])
    state.originate(Message(7, 3, -1.0))
    assert state.has((7, 3))
    assert state.take_outbox() == {2: [Message(7, 3, -1.0)], 4: [Message(7, 3, -1.0)]}


@pytest.mark.parametrize(
    ("action", "problem"),
    [
        (lambda s: s.originate(Message(0, 1, 0.0)), "cannot originate a message of 1"),
        (lambda s: s.originate(Message(0, 0, 0.0)), "already seen"),
        (lambda s: s.receive(5, []), "5 is not a neighbour of client 0"),
    ],
)
def test_misuse_is_refused(action: Callable[[FloodState], object], problem: str) -> None:
    state = FloodState(0, [1, 2])
    state.originate(Message(0, 0, 0.0))
    with pytest.raises(ValueError, match=problem):
        action(state)


def test_bad_neighbour_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="lists itself"):
        FloodState(1, [0, 1])
    with pytest.raises(ValueError, match="twice"):
        FloodState(1, [0, 0])


def test_forget_before_keeps_a_watermark() -> None:
    state = FloodState(0, [1])
    state.receive(1, [Message(5, 1, 1.0), Message(6, 1, 1.0), Message(6, 2, 1.0)])
    state.forget_before(6)
    assert state.retained_count == 2
    assert state.seen_count == 3
    assert state.has((5, 1)) and state.has((5, 99)) and not state.has((6, 3))
    assert state.receive(1, [Message(5, 2, 0.0), Message(6, 3, 0.0)]) == [Message(6, 3, 0.0)]
    assert state.duplicates_dropped == 1
    state.forget_before(2)
    assert state.has((5, 99)) and state.retained_count == 3


def test_forgetting_bounds_memory_in_long_runs() -> None:
    graph = ring(8)
    states = [FloodState(client, graph[client]) for client in range(8)]
    network = SimulatedNetwork(graph)
    for step in range(40):
        for state in states:
            state.originate(Message(step, state.me, 1.0))
        received = flood(states, network, hops=4)
        assert [len(messages) for messages in received] == [7] * 8
        for state in states:
            state.forget_before(step)
        assert max(state.retained_count for state in states) <= 16
    assert [state.seen_count for state in states] == [8 * 40] * 8
