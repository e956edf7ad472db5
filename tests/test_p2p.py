"""Frames and links between real hivemind peers: pushes arrive, requests are answered, a peer
that is gone is reported as such, and malformed frames are refused with the reason."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator

import pytest

p2p_module = pytest.importorskip("hivemind.p2p", reason="real-peer tests need hivemind installed")

from seedflood.p2p import (  # noqa: E402
    FLOOD_PROTOCOL,
    SYNC_PROTOCOL,
    EventLoopThread,
    Frame,
    Link,
    TransportError,
)


def test_frames_round_trip_and_reject_what_is_not_one() -> None:
    frame = Frame({"since": 7, "carried": [[1, 2, [{"kind": "hash"}]]]}, b"\x10\x00packet")
    assert Frame.decode(frame.encode()) == frame
    assert Frame.decode(Frame({}).encode()) == Frame({}, b"")
    with pytest.raises(TransportError, match="shorter than its length field"):
        Frame.decode(b"\x01\x02")
    with pytest.raises(TransportError, match="declares a 100-byte header but carries 2 bytes"):
        Frame.decode(struct.pack("<I", 100) + b"{}")
    with pytest.raises(TransportError, match="header is not JSON"):
        Frame.decode(struct.pack("<I", 3) + b"{x}")
    with pytest.raises(TransportError, match="must be a JSON object, not list"):
        Frame.decode(struct.pack("<I", 2) + b"[]")


@pytest.fixture()
def links() -> Iterator[tuple[Link, Link, list[tuple[str, bytes]]]]:
    runner = EventLoopThread()
    first = runner.run(p2p_module.P2P.create())
    second = runner.run(p2p_module.P2P.create(initial_peers=runner.run(first.get_visible_maddrs())))
    pushed: list[tuple[str, bytes]] = []
    arrived = threading.Event()

    def on_push(caller: str, data: bytes) -> None:
        pushed.append((caller, data))
        arrived.set()

    def on_request(caller: str, data: bytes) -> bytes:
        return Frame({"echo": Frame.decode(data).header, "from": caller}).encode()

    handlers = {FLOOD_PROTOCOL: on_push, SYNC_PROTOCOL: on_request}
    a, b = (Link(p2p, runner, handlers, timeout=5.0) for p2p in (first, second))
    a.start()
    b.start()
    a.arrived = arrived  # type: ignore[attr-defined]
    yield a, b, pushed
    runner.run(second.shutdown())
    runner.run(first.shutdown())
    runner.stop()


def test_pushes_arrive_and_requests_are_answered(links) -> None:
    a, b, pushed = links
    data = Frame({"n": 1}, b"body").encode()
    assert a.push({b.peer_id: data}) == {b.peer_id}
    assert a.arrived.wait(10)
    assert pushed == [(a.peer_id, data)]
    reply = b.request(a.peer_id, SYNC_PROTOCOL, Frame({"since": 3}).encode())
    assert Frame.decode(reply).header == {"echo": {"since": 3}, "from": b.peer_id}
    assert a.counters.sent[FLOOD_PROTOCOL] == len(data)
    assert b.counters.received[FLOOD_PROTOCOL] == len(data)
    assert b.counters.received[SYNC_PROTOCOL] == len(reply)


def test_a_peer_that_is_gone_is_reported_not_raised(links) -> None:
    a, b, _ = links
    gone = "QmbLr7Yva3LcNZq17Xx1ZDkiuXKjKgCt6xKMfMA6UMWVET"
    a.timeout = 1.0
    assert a.push({gone: b"x", b.peer_id: Frame({}).encode()}) == {b.peer_id}
    assert a.request(gone, SYNC_PROTOCOL, Frame({}).encode()) is None
