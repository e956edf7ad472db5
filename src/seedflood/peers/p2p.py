"""Talking to other peers over hivemind (libp2p; its p2pd daemon ships in the wheel).

A `Link` is one peer's end: it serves a few protocols, each a function from (caller's peer id,
request bytes) to reply bytes, and it sends one-way pushes and request/reply calls to other peers
by peer id. Flooding is a push of new messages to the neighbours; catching up after a crash or a
join, and repairing a lost push, are requests for everything held since a step.

Every payload is a `Frame`: a small JSON header (who sends, what rides along) and a binary body,
the codec packet of the messages. hivemind is asynchronous and training is not: the link runs
hivemind's event loop in a daemon thread, and serves requests in worker threads so a handler may
wait for the training thread without stalling the network.

A peer's bytes are hostile until checked, so the link asks its `Gate` before it reads a frame:
whether the caller (libp2p's authenticated peer id) may be heard on the protocol at all, and how
large a frame may be. It reads the 8-byte length hivemind puts before a frame and refuses one
over the cap without reading its body; a refused frame's stream is closed, the refusal counted
and, for an oversized or undecodable frame, its sender named to the gate to be banned.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import struct
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

FLOOD_PROTOCOL = "seedflood/flood/2"
SYNC_PROTOCOL = "seedflood/sync/2"
JOIN_PROTOCOL = "seedflood/join/1"
MAX_FRAME_BYTES = 64 << 20
"""The largest frame read on any protocol, whatever a gate allows."""
MAX_HEADER_BYTES = 16 << 20
JOIN_REQUEST_BYTES = 64 << 10
"""A join request: a peer id, a key and a config record (at most 64 short keys and values)."""
JOIN_REPLY_BYTES = 16 << 20
"""A join reply: an index and the members table, about 300 bytes a seat (50,000 seats)."""
WIRE_LENGTH_BYTES = 8
"""hivemind's length prefix of a frame on a stream: 8 bytes, big-endian (`P2P.HEADER_LEN`)."""
_LENGTH = struct.Struct("<I")
T = TypeVar("T")
Handler = Callable[[str, bytes], bytes | None]


class TransportError(RuntimeError):
    """A frame that is not one, or a peer that did not answer."""


class Refusal(StrEnum):
    """Why the link dropped a frame before (or instead of) a handler's answer."""

    OVERSIZED = "oversized"
    UNDECODABLE = "undecodable"
    NOT_MEMBER_CALLER = "not_member_caller"
    BANNED_CALLER = "banned_caller"


def join_cap(reply: bool) -> int:
    return JOIN_REPLY_BYTES if reply else JOIN_REQUEST_BYTES


class Gate(Protocol):
    """Whom a link hears and how much: the node's exchange, once it exists."""

    def refusal(self, caller: str, protocol: str) -> Refusal | None:
        """Why ``caller``'s frames on ``protocol`` are not read at all; None to read them."""
        ...

    def cap(self, protocol: str, reply: bool) -> int:
        """The largest request (or, with ``reply``, reply) frame read on ``protocol``."""
        ...

    def refused(self, peer: str, protocol: str, reason: Refusal) -> None:
        """Count a dropped frame of ``peer``'s (and ban it where the reason says it lied)."""
        ...


class OpenGate:
    """Hears everyone, within fixed caps, and only counts what it drops: a link's gate before
    its node is seated (a joiner's link asks for its seat) and in tests."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def refusal(self, caller: str, protocol: str) -> Refusal | None:
        return None

    def cap(self, protocol: str, reply: bool) -> int:
        return join_cap(reply) if protocol == JOIN_PROTOCOL else MAX_FRAME_BYTES

    def refused(self, peer: str, protocol: str, reason: Refusal) -> None:
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + 1


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


@dataclass(frozen=True)
class Frame:
    """A JSON header and a binary body (a codec packet, or empty)."""

    header: dict[str, Any]
    body: bytes = b""

    def encode(self) -> bytes:
        header = json.dumps(self.header, separators=(",", ":")).encode()
        return _LENGTH.pack(len(header)) + header + self.body

    @classmethod
    def decode(cls, data: bytes) -> Frame:
        """The frame in ``data``, or TransportError naming what is wrong: a peer's bytes are
        untrusted, so no length is believed beyond what arrived and no parser error escapes."""
        if not isinstance(data, (bytes, bytearray)):
            raise TransportError(f"a frame is bytes, not {type(data).__name__}")
        if len(data) < _LENGTH.size:
            raise TransportError(f"frame of {len(data)} bytes is shorter than its length field")
        (size,) = _LENGTH.unpack_from(data)
        if size > min(MAX_HEADER_BYTES, len(data) - _LENGTH.size):
            raise TransportError(
                f"frame declares a {size}-byte header but carries {len(data) - _LENGTH.size} "
                f"bytes (at most {MAX_HEADER_BYTES} allowed)"
            )
        try:
            header = json.loads(
                data[_LENGTH.size : _LENGTH.size + size],
                parse_float=_finite,
                parse_constant=_finite,
            )
        except RecursionError:
            raise TransportError("frame header is not JSON: nested too deeply") from None
        except ValueError as exc:  # bad UTF-8, bad JSON, NaN/Infinity, integers too long
            raise TransportError(f"frame header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise TransportError(f"frame header must be a JSON object, not {type(header).__name__}")
        return cls(header, data[_LENGTH.size + size :])


class EventLoopThread:
    """An asyncio loop in a daemon thread, for hivemind calls from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # handlers run in worker threads and may wait there for a slow or dead peer
        self.loop.set_default_executor(ThreadPoolExecutor(max_workers=32))
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        """Stop the loop, then finish the tasks left on it and close it.

        hivemind's control client cancels its tasks without awaiting them; left pending on a
        loop that is collected later, they die at garbage collection with "Event loop is
        closed", in whatever code happens to run then.
        """
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if self._thread.is_alive():
            return  # a callback still holds the loop: closing it under that thread would break it

        async def cancel_what_is_left() -> None:
            left = asyncio.all_tasks() - {asyncio.current_task()}
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        self.loop.run_until_complete(cancel_what_is_left())
        self.loop.close()


@dataclass
class LinkCounters:
    """Bytes this peer moved, by protocol and direction."""

    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)

    def add(self, table: dict[str, int], protocol: str, size: int) -> None:
        table[protocol] = table.get(protocol, 0) + size


class Link:
    """One peer's end of the network: serves ``handlers`` (protocol → function) and calls
    others'. A peer that is gone is not an error here: calls report it by returning False or
    None, and the membership layer decides what the absence means."""

    def __init__(
        self, p2p: Any, runner: EventLoopThread, handlers: Mapping[str, Handler], timeout: float
    ) -> None:
        from hivemind.p2p import PeerID

        self._peer_id = PeerID.from_base58
        self.p2p, self.runner = p2p, runner
        self.handlers = dict(handlers)
        self.timeout = timeout
        self.counters = LinkCounters()
        self.gate: Gate = OpenGate()
        self._lock = threading.Lock()

    @property
    def peer_id(self) -> str:
        return self.p2p.peer_id.to_base58()

    def start(self) -> None:
        for protocol in self.handlers:
            self.runner.run(self.p2p.add_binary_stream_handler(protocol, self._serve(protocol)))

    def _serve(self, protocol: str) -> Callable[[Any, asyncio.StreamReader, Any], Coroutine]:
        handler = self.handlers[protocol]

        async def serve(info: Any, reader: asyncio.StreamReader, writer: Any) -> None:
            caller = info.peer_id.to_base58()
            try:
                refusal = self.gate.refusal(caller, protocol)
                if refusal is not None:  # dropped unread: not even its length is taken
                    self.gate.refused(caller, protocol, refusal)
                    return
                data = await self.receive(reader, caller, protocol, reply=False)
                if data is None:
                    return
                reply = await asyncio.get_running_loop().run_in_executor(
                    None, self._handle, handler, caller, protocol, data
                )
                if reply is not None:
                    await self.p2p.send_raw_data(reply, writer)
                    self._count(self.counters.sent, protocol, len(reply))
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        return serve

    async def receive(
        self, reader: asyncio.StreamReader, peer: str, protocol: str, reply: bool
    ) -> bytes | None:
        """One frame from ``peer``, or None when its stated length is over the protocol's cap:
        then not a byte of its body is read (hivemind's own reader would allocate any length)."""
        prefix = await reader.readexactly(WIRE_LENGTH_BYTES)
        size = int.from_bytes(prefix, "big")
        if size > min(self.gate.cap(protocol, reply), MAX_FRAME_BYTES):
            self.gate.refused(peer, protocol, Refusal.OVERSIZED)
            return None
        data = await reader.readexactly(size)
        self._count(self.counters.received, protocol, len(data))
        return data

    def _handle(self, handler: Handler, caller: str, protocol: str, data: bytes) -> bytes | None:
        """The handler's answer; a frame it cannot parse (a TransportError or ValueError, which
        the codec's errors are) is counted as undecodable and answered with nothing."""
        try:
            return handler(caller, data)
        except (TransportError, ValueError):
            self.gate.refused(caller, protocol, Refusal.UNDECODABLE)
            return None

    def _count(self, table: dict[str, int], protocol: str, size: int) -> None:
        with self._lock:
            self.counters.add(table, protocol, size)

    async def _call(self, peer: str, protocol: str, data: bytes, reply: bool) -> bytes | None:
        _, reader, writer = await asyncio.wait_for(
            self.p2p.call_binary_stream_handler(self._peer_id(peer), protocol), self.timeout
        )
        try:
            await self.p2p.send_raw_data(data, writer)
            self._count(self.counters.sent, protocol, len(data))
            if not reply:
                return b""
            return await asyncio.wait_for(
                self.receive(reader, peer, protocol, reply=True), self.timeout
            )
        finally:
            writer.close()

    async def _attempt(self, peer: str, protocol: str, data: bytes, reply: bool) -> bytes | None:
        try:
            return await self._call(peer, protocol, data, reply)
        except Exception:  # any failure of the daemon, the stream or the peer means "no answer"
            return None

    def push(self, messages_for: Mapping[str, bytes], protocol: str = FLOOD_PROTOCOL) -> set[str]:
        """Send each peer its bytes, all at once; the peers that were reached."""

        async def push_all() -> list[bytes | None]:
            calls = [self._attempt(p, protocol, d, False) for p, d in messages_for.items()]
            return await asyncio.gather(*calls)

        results = self.runner.run(push_all())
        return {peer for peer, got in zip(messages_for, results, strict=True) if got is not None}

    def close(self) -> None:
        self.runner.run(self.p2p.shutdown(), timeout=10)

    def fault_counts(self) -> dict[str, int]:
        """Pushes failed on purpose, by fault (none: this link is honest)."""
        return {}

    def request(self, peer: str, protocol: str, data: bytes) -> bytes | None:
        """The peer's reply, or None when it could not be reached or did not answer in time."""
        return self.runner.run(self._attempt(peer, protocol, data, True))


FAULTS_VARIABLE = "SEEDFLOOD_LINK_FAULTS"


class LinkFault(StrEnum):
    """What a `FaultyLink` does to a flood push on purpose."""

    DROP = "drop"
    DUPLICATE = "duplicate"
    DELAY = "delay"
    CORRUPT = "corrupt"


def parse_faults(text: str) -> tuple[dict[LinkFault, float], int]:
    """Fault rates and a seed from ``drop=0.3,delay=0.1,seed=5`` (the form of
    ``$SEEDFLOOD_LINK_FAULTS``, which tests set to make a peer process's link unreliable)."""
    rates: dict[LinkFault, float] = {}
    seed = 0
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{FAULTS_VARIABLE}: {item!r} is not name=number") from None
        if name == "seed":
            seed = int(number)
        elif name in set(LinkFault) and 0.0 <= number <= 1.0:
            rates[LinkFault(name)] = number
        else:
            allowed = ", ".join(f.value for f in LinkFault)
            raise ValueError(
                f"{FAULTS_VARIABLE}: {item!r} must be one of {allowed} with a rate in [0, 1], "
                "or seed=<int>"
            )
    if sum(rates.values()) > 1.0:
        raise ValueError(f"{FAULTS_VARIABLE}: the fault rates add up to more than 1 in {text!r}")
    return rates, seed


class FaultyLink(Link):
    """A `Link` whose flood pushes fail on purpose, with seeded probabilities: dropped (the sender
    believes it was sent, as with a lost packet), sent twice, sent after ``delay`` seconds, or
    sent with one body byte flipped. Requests (pull repair, joins) are left alone: they are what
    recovers from the faults."""

    def __init__(
        self,
        p2p: Any,
        runner: EventLoopThread,
        handlers: Mapping[str, Handler],
        timeout: float,
        *,
        rates: Mapping[LinkFault, float],
        seed: int,
        delay: float = 0.5,
    ) -> None:
        super().__init__(p2p, runner, handlers, timeout)
        self.rates, self.delay = dict(rates), delay
        self.random = random.Random(seed)
        self.faults: dict[str, int] = {fault.value: 0 for fault in LinkFault}
        self.pushes = 0

    def fault_counts(self) -> dict[str, int]:
        return {**self.faults, "pushes": self.pushes}

    def _fault(self) -> LinkFault | None:
        self.pushes += 1
        draw, total = self.random.random(), 0.0
        for fault, rate in self.rates.items():
            total += rate
            if draw < total:
                self.faults[fault.value] += 1
                return fault
        return None

    def push(self, messages_for: Mapping[str, bytes], protocol: str = FLOOD_PROTOCOL) -> set[str]:
        sent: dict[str, bytes] = {}
        again: dict[str, bytes] = {}
        later: dict[str, bytes] = {}
        with self._lock:
            faults = {peer: self._fault() for peer in messages_for}
        for peer, data in messages_for.items():
            fault = faults[peer]
            if fault is LinkFault.DELAY:
                later[peer] = data
            elif fault is LinkFault.CORRUPT:
                sent[peer] = data[:-1] + bytes([data[-1] ^ 0x01]) if data else data
            elif fault is not LinkFault.DROP:
                sent[peer] = data
                if fault is LinkFault.DUPLICATE:
                    again[peer] = data
        reached = super().push(sent, protocol) if sent else set()
        if again:
            super().push(again, protocol)
        if later:
            timer = threading.Timer(self.delay, super().push, (later, protocol))
            timer.daemon = True
            timer.start()
        return reached | set(faults) - set(sent)
