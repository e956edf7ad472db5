"""Flood packets between real peers over hivemind (libp2p; its p2pd daemon ships in the wheel).

`PeerTransport` is the transport of one peer hosting one client: the same `hop` as the simulated
network, so `flood` and the flooding protocol run unchanged. Peers advance in lockstep: every peer
runs every hop and sends each neighbour exactly one envelope per hop, empty when it owes nothing,
so a receiver knows a hop is complete as soon as every neighbour's envelope is in, and waits the
timeout only for a neighbour that is slow or gone (that neighbour is then reported missing).

hivemind is asynchronous and training is not: the transport runs hivemind's event loop in a
daemon thread and the training thread waits on it.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from seedflood.messages import CodecError, Message, decode_packet, encode_packet
from seedflood.network import SCALAR_BYTES, Deliveries, TrafficCounter

FLOOD_PROTOCOL = "seedflood/flood/1"
_HEADER = struct.Struct("<QII")
MAX_ENVELOPE_BYTES = 64 << 20
T = TypeVar("T")


class TransportError(RuntimeError):
    """A neighbour that did not deliver, or an envelope that is not one."""


@dataclass(frozen=True)
class Envelope:
    """One hop's packet from one client to a neighbour: (hop sequence number, sender) and the
    codec packet, empty when the sender owes this neighbour nothing."""

    sequence: int
    sender: int
    packet: bytes

    def encode(self) -> bytes:
        return _HEADER.pack(self.sequence, self.sender, len(self.packet)) + self.packet

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        if len(data) < _HEADER.size:
            raise TransportError(f"envelope of {len(data)} bytes is shorter than its header")
        sequence, sender, size = _HEADER.unpack_from(data)
        if size != len(data) - _HEADER.size:
            raise TransportError(
                f"envelope declares a {size}-byte packet but carries {len(data) - _HEADER.size}"
            )
        return cls(sequence, sender, data[_HEADER.size :])


class EventLoopThread:
    """An asyncio loop in a daemon thread, for hivemind calls from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class PeerTransport:
    """The flood transport of one peer: sends this client's packets to its neighbours' peers and
    collects theirs, one hop at a time, counting bytes on its outgoing edges."""

    hosts_everyone = False

    def __init__(
        self,
        *,
        me: int,
        neighbor_peers: Mapping[int, Any],
        p2p: Any,
        runner: EventLoopThread,
        scalar_format: str = "fp32",
        timeout: float = 30.0,
        clients: int,
    ) -> None:
        self.me = me
        self.neighbor_peers = dict(neighbor_peers)
        self.p2p = p2p
        self.runner = runner
        self.scalar_format = scalar_format
        self.timeout = timeout
        self.sequence = 0
        self.missing: list[tuple[int, int]] = []
        self.unreachable: list[tuple[int, int]] = []
        rows: list[Sequence[int]] = [() for _ in range(clients)]
        rows[me] = sorted(self.neighbor_peers)
        for neighbor in self.neighbor_peers:
            rows[neighbor] = (me,)
        self.counter = TrafficCounter(rows)
        self._inbox: dict[int, dict[int, bytes]] = {}
        self._arrived = threading.Condition()
        self._senders = {str(peer): client for client, peer in self.neighbor_peers.items()}

    def start(self) -> None:
        self.runner.run(self.p2p.add_binary_stream_handler(FLOOD_PROTOCOL, self._handle))

    async def _handle(self, info: Any, reader: asyncio.StreamReader, writer: Any) -> None:
        data = await self.p2p.receive_raw_data(reader)
        writer.close()
        if len(data) > MAX_ENVELOPE_BYTES:
            return
        try:
            envelope = Envelope.decode(data)
        except TransportError:
            return
        if self._senders.get(str(info.peer_id)) != envelope.sender:
            return
        with self._arrived:
            self._inbox.setdefault(envelope.sequence, {})[envelope.sender] = envelope.packet
            self._arrived.notify_all()

    async def _send(self, neighbor: int, envelope: Envelope) -> bool:
        """Whether the envelope reached the neighbour's daemon; a peer that is gone is not an
        error here, the membership layer decides what its absence means."""
        try:
            _, _, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(self.neighbor_peers[neighbor], FLOOD_PROTOCOL),
                self.timeout,
            )
            await self.p2p.send_raw_data(envelope.encode(), writer)
            writer.close()
        except Exception:  # any failure of the daemon or the stream means "not sent"
            return False
        return True

    async def _send_all(self, envelopes: Mapping[int, Envelope]) -> list[bool]:
        return await asyncio.gather(*(self._send(n, e) for n, e in envelopes.items()))

    def hop(self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]]) -> Deliveries:
        """Send this hop's envelope to every neighbour and wait for theirs."""
        sequence, self.sequence = self.sequence, self.sequence + 1
        owed = outboxes.get(self.me, {})
        envelopes = {}
        for neighbor in sorted(self.neighbor_peers):
            messages = owed.get(neighbor, ())
            packet = encode_packet(messages, self.scalar_format) if messages else b""
            envelopes[neighbor] = Envelope(sequence, self.me, packet)
        sent = self.runner.run(self._send_all(envelopes))
        for (neighbor, envelope), delivered in zip(envelopes.items(), sent, strict=True):
            if not delivered:
                self.unreachable.append((sequence, neighbor))
            elif envelope.packet:
                self._count(self.me, neighbor, envelope.packet, len(owed[neighbor]))
        with self._arrived:
            complete = self._arrived.wait_for(
                lambda: len(self._inbox.get(sequence, {})) == len(self.neighbor_peers),
                self.timeout,
            )
            arrived = self._inbox.pop(sequence, {})
        if not complete:
            self.missing += [(sequence, n) for n in self.neighbor_peers if n not in arrived]
        received = []
        for sender in sorted(arrived):
            if not arrived[sender]:
                continue
            try:
                messages, _ = decode_packet(arrived[sender])
            except CodecError as exc:
                raise TransportError(f"client {sender} sent a bad packet: {exc}") from None
            self._count(sender, self.me, arrived[sender], len(messages))
            received.append((sender, messages))
        return {self.me: received} if received else {}

    def _count(self, sender: int, receiver: int, packet: bytes, messages: int) -> None:
        """Both directions of this peer's edges, as the simulator counts them: the codec packet,
        not the envelope header or libp2p's framing."""
        self.counter.count(
            sender,
            receiver,
            size=len(packet),
            messages=messages,
            header_bytes=len(packet) - messages * SCALAR_BYTES[self.scalar_format],
        )

    def summary(self) -> dict[str, float]:
        return self.counter.summary()
