"""Simulated transport: clients hosted in one process exchange real packets, one hop at a time.

Every packet is encoded and decoded again rather than handing Message objects across, so byte
counts are exact and receivers see precisely what a wire carries, scalar rounding included. The
interface, `hop` over a mapping of local senders, is the one a real-peer transport implements
while hosting a single client; `flood` drives either.
"""

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from seedflood.flooding import FloodState
from seedflood.messages import SCALAR_BYTES, SCALAR_FORMATS, Message, decode_packet, encode_packet

Deliveries = dict[int, list[tuple[int, list[Message]]]]
Packet = tuple[int, int, bytes]
"""(sender, receiver, bytes) of one packet on one directed edge."""


@dataclass
class EdgeTraffic:
    """What crossed one directed edge (sender, receiver) so far."""

    bytes: int = 0
    messages: int = 0
    packets: int = 0
    header_bytes: int = 0


class Transport(Protocol):
    """What `flood` needs from a transport, simulated or real. ``hosts_everyone`` says whether
    this process hosts every client, so that "nothing owed here" means "nothing owed anywhere"."""

    hosts_everyone: bool

    def hop(self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]]) -> Deliveries: ...


class TrafficCounter:
    """Bytes, messages and packets on every directed edge of a graph, for every method alike."""

    def __init__(self, neighbors: Sequence[Sequence[int]]) -> None:
        self.traffic: dict[tuple[int, int], EdgeTraffic] = {
            (client, other): EdgeTraffic()
            for client, row in enumerate(neighbors)
            for other in sorted(row)
        }

    def count(
        self, sender: int, receiver: int, *, size: int, messages: int, header_bytes: int = 0
    ) -> None:
        """One packet of ``size`` bytes holding ``messages`` messages crossed sender → receiver."""
        edge = self.traffic.get((sender, receiver))
        if edge is None:
            raise ValueError(f"client {sender} cannot send to {receiver}: not neighbours")
        edge.bytes += size
        edge.messages += messages
        edge.packets += 1
        edge.header_bytes += header_bytes

    def summary(self) -> dict[str, float]:
        return edge_summary(self.traffic)


def edge_summary(traffic: Mapping[tuple[int, int], EdgeTraffic]) -> dict[str, float]:
    """Traffic totals. "Per edge" means per undirected edge with both directions added, the
    paper's "total communication per edge"; max and mean run over the graph's edges. Real peers
    count their own sending side, so merging their directed edges gives the same figures."""
    empty = EdgeTraffic()
    undirected = sorted({(min(s, r), max(s, r)) for s, r in traffic})
    pairs = [(traffic.get((a, b), empty), traffic.get((b, a), empty)) for a, b in undirected]

    def per_edge(field: str) -> list[int]:
        get = operator.attrgetter(field)
        return [get(forward) + get(backward) for forward, backward in pairs]

    def mean(values: list[int]) -> float:
        return sum(values) / len(values) if values else 0.0

    byte_counts, message_counts = per_edge("bytes"), per_edge("messages")
    return {
        "bytes_per_edge_max": float(max(byte_counts, default=0)),
        "bytes_per_edge_mean": mean(byte_counts),
        "messages_per_edge_max": float(max(message_counts, default=0)),
        "messages_per_edge_mean": mean(message_counts),
        "header_bytes_per_edge_max": float(max(per_edge("header_bytes"), default=0)),
        "packets_total": float(sum(edge.packets for edge in traffic.values())),
        "bytes_total": float(sum(edge.bytes for edge in traffic.values())),
    }


class SimulatedNetwork:
    """Delivers packets between clients hosted in one process, one synchronous hop at a time, and
    counts every byte and message on every directed edge."""

    hosts_everyone = True

    def __init__(self, neighbors: Sequence[Sequence[int]], scalar_format: str = "fp32") -> None:
        if scalar_format not in SCALAR_FORMATS:
            raise ValueError(
                f"scalar_format {scalar_format!r} is not one of {', '.join(SCALAR_FORMATS)}"
            )
        n = len(neighbors)
        adjacency = [set(row) for row in neighbors]
        for client, row in enumerate(neighbors):
            if len(adjacency[client]) != len(row):
                raise ValueError(f"client {client} lists a neighbour twice: {list(row)}")
            for other in row:
                if not 0 <= other < n or other == client:
                    raise ValueError(f"client {client} has invalid neighbour {other} (n = {n})")
                if client not in adjacency[other]:
                    raise ValueError(
                        f"edge {client}-{other} is listed by {client} but not by {other}: "
                        "the graph must be undirected"
                    )
        self.scalar_format = scalar_format
        self.neighbors: tuple[tuple[int, ...], ...] = tuple(tuple(row) for row in neighbors)
        self.counter = TrafficCounter(self.neighbors)
        self.traffic = self.counter.traffic

    def hop(self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]]) -> Deliveries:
        """Send one packet per non-empty (sender, receiver) list; receptions in arrival order,
        which on perfect links is by sender."""
        deliveries: Deliveries = {}
        for sender, receiver, packet in self.carry("flood", self.send(outboxes, self.counter)):
            received, _ = decode_packet(packet)
            deliveries.setdefault(receiver, []).append((sender, received))
        return deliveries

    def send(
        self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]], counter: TrafficCounter
    ) -> list[Packet]:
        """Encode one packet per non-empty (sender, receiver) list and count it on ``counter``.

        All packets are encoded before anything is counted, so a hop that fails leaves the
        traffic counters untouched.
        """
        packets: list[tuple[int, int, int, bytes]] = []
        for sender in sorted(outboxes):
            for receiver in sorted(outboxes[sender]):
                messages = outboxes[sender][receiver]
                if not messages:
                    continue
                if (sender, receiver) not in self.traffic:
                    raise ValueError(f"client {sender} cannot send to {receiver}: not neighbours")
                packet = encode_packet(messages, self.scalar_format)
                packets.append((sender, receiver, len(messages), packet))
        scalar_bytes = SCALAR_BYTES[self.scalar_format]
        for sender, receiver, count, packet in packets:
            counter.count(
                sender,
                receiver,
                size=len(packet),
                messages=count,
                header_bytes=len(packet) - count * scalar_bytes,
            )
        return [(sender, receiver, packet) for sender, receiver, _, packet in packets]

    def live(self, sender: int, receiver: int) -> bool:
        """Whether the edge carries anything now; perfect links are never cut."""
        return (sender, receiver) in self.traffic

    def carry(self, channel: str, packets: Sequence[Packet]) -> list[Packet]:
        """One hop of a channel: perfect links hand everything over at once, once, in order.
        `seedflood.faults.FaultyNetwork` overrides this to lose, repeat, reorder and delay."""
        return list(packets)

    def summary(self) -> dict[str, float]:
        return self.counter.summary()


def flood(states: Sequence[FloodState], network: Transport, hops: int) -> list[list[Message]]:
    """Run up to `hops` hops; per state (in the order given), the new messages it received.

    Where the transport hosts every client, stopping once nothing is owed keeps a round with k
    larger than needed from costing empty hops; real peers run every hop in lockstep.
    """
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    position = {state.me: index for index, state in enumerate(states)}
    if len(position) != len(states):
        raise ValueError("two flood states share one client id")
    received: list[list[Message]] = [[] for _ in states]
    for _ in range(hops):
        outboxes = {state.me: box for state in states if (box := state.take_outbox())}
        if not outboxes and network.hosts_everyone:
            break
        for receiver, packets in network.hop(outboxes).items():
            index = position.get(receiver)
            if index is None:
                raise ValueError(f"the transport delivered to client {receiver}, not hosted here")
            for sender, messages in packets:
                received[index].extend(states[index].receive(sender, messages))
    for messages in received:
        messages.sort(key=operator.attrgetter("key"))
    return received
