"""Frames and links between real hivemind peers: pushes arrive, requests are answered, a peer
that is gone is reported as such, and malformed frames are refused with the reason."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator

import pytest

p2p_module = pytest.importorskip("hivemind.p2p", reason="real-peer tests need hivemind installed")
# real hivemind daemons, marked to run one test at a time (see the Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_peers")]

from seedflood.peers.p2p import (  # noqa: E402
    FLOOD_PROTOCOL,
    SYNC_PROTOCOL,
    EventLoopThread,
    FaultyLink,
    Frame,
    Link,
    LinkFault,
    TransportError,
    parse_faults,
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


def test_stopping_the_loop_thread_finishes_what_was_left_on_it() -> None:
    """hivemind's control client cancels its tasks without awaiting them: stop must finish what
    is left and close the loop, or the tasks die noisily whenever the loop is collected."""
    runner = EventLoopThread()

    async def wait_on_a_queue() -> asyncio.Future:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        return asyncio.ensure_future(queue.get())

    left = runner.run(wait_on_a_queue())
    runner.stop()
    assert runner.loop.is_closed() and left.cancelled()


def test_fault_settings_parse_and_bad_ones_are_named() -> None:
    assert parse_faults("drop=0.3, delay=0.1,seed=5") == (
        {LinkFault.DROP: 0.3, LinkFault.DELAY: 0.1},
        5,
    )
    assert parse_faults("") == ({}, 0)
    with pytest.raises(ValueError, match=r"'lose=0\.1' must be one of drop, duplicate, delay"):
        parse_faults("lose=0.1")
    with pytest.raises(ValueError, match=r"'drop=1\.5' must be one of"):
        parse_faults("drop=1.5")
    with pytest.raises(ValueError, match="'drop' is not name=number"):
        parse_faults("drop")
    with pytest.raises(ValueError, match="add up to more than 1"):
        parse_faults("drop=0.6,duplicate=0.6")


def arrivals(pushed: list, count: int, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    while len(pushed) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # and nothing more arrives
    return list(pushed)


def test_a_faulty_link_drops_repeats_delays_and_corrupts_pushes(links) -> None:
    a, b, pushed = links

    def faulty(fault: LinkFault, rate: float = 1.0) -> FaultyLink:
        # A generous push timeout: on a loaded machine a repeat that times out is lost silently.
        return FaultyLink(b.p2p, b.runner, {}, 30.0, rates={fault: rate}, seed=3, delay=0.5)

    data = Frame({"n": 1}, b"body").encode()
    dropping = faulty(LinkFault.DROP)
    assert dropping.push({a.peer_id: data}) == {a.peer_id}  # the sender cannot tell
    assert arrivals(pushed, 1, timeout=1.0) == []
    assert faulty(LinkFault.DUPLICATE).push({a.peer_id: data}) == {a.peer_id}
    assert arrivals(pushed, 2) == [(b.peer_id, data)] * 2
    pushed.clear()
    faulty(LinkFault.CORRUPT).push({a.peer_id: data})
    [(_, corrupted)] = arrivals(pushed, 1)
    assert corrupted[:-1] == data[:-1] and corrupted[-1] == data[-1] ^ 1
    pushed.clear()
    started = time.monotonic()
    faulty(LinkFault.DELAY).push({a.peer_id: data})
    assert pushed == [] and arrivals(pushed, 1) == [(b.peer_id, data)]
    assert time.monotonic() - started >= 0.5
    # seeded: the same seed drops the same pushes, at about the rate asked for
    draws = [faulty(LinkFault.DROP, 0.3) for _ in range(2)]
    faults = [[link._fault() for _ in range(1000)] for link in draws]
    assert faults[0] == faults[1] and 250 < faults[0].count(LinkFault.DROP) < 350
    assert draws[0].fault_counts() == {
        "drop": faults[0].count(LinkFault.DROP),
        "duplicate": 0,
        "delay": 0,
        "corrupt": 0,
        "pushes": 1000,
    }
