"""Simulated transport: clients hosted in one process exchange real packets, one hop at a time.

Every packet is encoded and decoded again rather than handing Message objects across, so byte
counts are exact and receivers see precisely what a wire carries, scalar rounding included. It
implements the flooding protocol's `Transport` (`hop` over a mapping of local senders), the
interface a real-peer transport implements while hosting a single client.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from seedflood.protocol.flooding import Deliveries
from seedflood.protocol.messages import (
    SCALAR_BYTES,
    SCALAR_FORMATS,
    Message,
    decode_packet,
    encode_and_view,
)
from seedflood.protocol.traffic import Packet, TrafficCounter

CODEC_MEMORY = 1 << 16
"""Packets each simulated network remembers encoding and decoding, at most (then forgets all)."""


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
        self._encoded: dict[tuple[Message, ...], bytes] = {}
        self._decoded: dict[bytes, tuple[Message, ...]] = {}

    def _encode(self, messages: Sequence[Message]) -> bytes:
        """``encode_packet``, remembered: flooding forwards each message hop after hop, so the
        same packet is built again by every client it passes (64 times on a 128-client ring).
        What decoding it gives is remembered with it (`encode_and_view`), so a packet that
        arrives as it was sent is not parsed."""
        key = tuple(messages)
        packet = self._encoded.get(key)
        if packet is None:
            for memory in (self._encoded, self._decoded):
                if len(memory) >= CODEC_MEMORY:
                    memory.clear()
            packet, view = encode_and_view(messages, self.scalar_format)
            self._encoded[key], self._decoded[packet] = packet, tuple(view)
        return packet

    def _decode(self, packet: bytes) -> list[Message]:
        """``decode_packet``, remembered alike; a packet that does not decode raises every time
        (a faulty link's corrupted copies), and real peers decode every packet afresh."""
        messages = self._decoded.get(packet)
        if messages is None:
            if len(self._decoded) >= CODEC_MEMORY:
                self._decoded.clear()
            messages = self._decoded[packet] = tuple(decode_packet(packet)[0])
        return list(messages)

    def hop(self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]]) -> Deliveries:
        """Send one packet per non-empty (sender, receiver) list; receptions in arrival order,
        which on perfect links is by sender."""
        deliveries: Deliveries = {}
        for sender, receiver, packet in self.carry("flood", self.send(outboxes, self.counter)):
            received = self._decode(packet)
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
                packet = self._encode(messages)
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
        `seedflood.sim.faults.FaultyNetwork` overrides this to lose, repeat, reorder and delay."""
        return list(packets)

    def at_round(self, round_index: int) -> None:
        """Perfect links are the same in every round."""

    def summary(self) -> dict[str, float]:
        return self.counter.summary()

    def describe(self) -> dict[str, Any]:
        """What the links did beyond carrying packets: nothing, on perfect links."""
        return {}
