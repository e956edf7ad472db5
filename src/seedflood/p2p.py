"""Talking to other peers over hivemind (libp2p; its p2pd daemon ships in the wheel).

A `Link` is one peer's end: it serves a few protocols, each a function from (caller's peer id,
request bytes) to reply bytes, and it sends one-way pushes and request/reply calls to other peers
by peer id. Flooding is a push of new messages to the neighbours; catching up after a crash or a
join, and repairing a lost push, are requests for everything held since a step.

Every payload is a `Frame`: a small JSON header (who sends, what rides along) and a binary body,
the codec packet of the messages. hivemind is asynchronous and training is not: the link runs
hivemind's event loop in a daemon thread, and serves requests in worker threads so a handler may
wait for the training thread without stalling the network.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

FLOOD_PROTOCOL = "seedflood/flood/2"
SYNC_PROTOCOL = "seedflood/sync/2"
JOIN_PROTOCOL = "seedflood/join/1"
MAX_FRAME_BYTES = 256 << 20
MAX_HEADER_BYTES = 16 << 20
_LENGTH = struct.Struct("<I")
T = TypeVar("T")
Handler = Callable[[str, bytes], bytes | None]


class TransportError(RuntimeError):
    """A frame that is not one, or a peer that did not answer."""


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
        if len(data) < _LENGTH.size:
            raise TransportError(f"frame of {len(data)} bytes is shorter than its length field")
        (size,) = _LENGTH.unpack_from(data)
        if size > min(MAX_HEADER_BYTES, len(data) - _LENGTH.size):
            raise TransportError(
                f"frame declares a {size}-byte header but carries {len(data) - _LENGTH.size} "
                f"bytes (at most {MAX_HEADER_BYTES} allowed)"
            )
        try:
            header = json.loads(data[_LENGTH.size : _LENGTH.size + size])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


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
            try:
                data = await self.p2p.receive_raw_data(reader)
                self._count(self.counters.received, protocol, len(data))
                reply = await asyncio.get_running_loop().run_in_executor(
                    None, handler, info.peer_id.to_base58(), data
                )
                if reply is not None:
                    await self.p2p.send_raw_data(reply, writer)
                    self._count(self.counters.sent, protocol, len(reply))
            except (asyncio.IncompleteReadError, ConnectionError, TransportError):
                pass
            finally:
                writer.close()

        return serve

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
            answer = await asyncio.wait_for(self.p2p.receive_raw_data(reader), self.timeout)
            if len(answer) > MAX_FRAME_BYTES:
                raise TransportError(f"{peer} answered {len(answer)} bytes")
            self._count(self.counters.received, protocol, len(answer))
            return answer
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

    def request(self, peer: str, protocol: str, data: bytes) -> bytes | None:
        """The peer's reply, or None when it could not be reached or did not answer in time."""
        return self.runner.run(self._attempt(peer, protocol, data, True))
