"""Traffic accounting: bytes, messages and packets on every directed edge, counted alike for
every method, simulated or real, so that "bytes per edge" means one thing in every table."""

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Packet = tuple[int, int, bytes]
"""(sender, receiver, bytes) of one packet on one directed edge."""


@dataclass
class EdgeTraffic:
    """What crossed one directed edge (sender, receiver) so far."""

    bytes: int = 0
    messages: int = 0
    packets: int = 0
    header_bytes: int = 0


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
