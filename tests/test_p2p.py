"""Flooding over real hivemind peers delivers what the simulated network delivers, byte for byte."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from seedflood.flooding import FloodState
from seedflood.messages import Message
from seedflood.network import SimulatedNetwork, flood
from seedflood.topology import make_topology

p2p_module = pytest.importorskip("hivemind.p2p", reason="real-peer tests need hivemind installed")

from seedflood.p2p import Envelope, EventLoopThread, PeerTransport, TransportError  # noqa: E402


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[EventLoopThread, list]]:
    runner = EventLoopThread()
    first = runner.run(p2p_module.P2P.create())
    bootstrap = runner.run(first.get_visible_maddrs())
    rest = [runner.run(p2p_module.P2P.create(initial_peers=bootstrap)) for _ in range(3)]
    yield runner, [first, *rest]
    for p2p in [first, *rest]:
        runner.run(p2p.shutdown())
    runner.stop()


def round_messages(round_index: int, n: int) -> list[Message]:
    return [Message(round_index, origin, origin + round_index / 4) for origin in range(n)]


def test_envelopes_round_trip_and_reject_bad_lengths() -> None:
    envelope = Envelope(7, 3, b"\x10\x00packet")
    assert Envelope.decode(envelope.encode()) == envelope
    with pytest.raises(TransportError, match="shorter than its header"):
        Envelope.decode(b"\x01\x02")
    with pytest.raises(TransportError, match="declares a 8-byte packet but carries 6"):
        Envelope.decode(envelope.encode()[:-2])


def started_transports(runner: EventLoopThread, p2ps: list, topology) -> list[PeerTransport]:
    """Client i on p2ps[i], connected to its topology neighbours' peers, listening."""
    transports = [
        PeerTransport(
            me=client,
            neighbor_peers={n: p2ps[n].peer_id for n in topology.neighbors[client]},
            p2p=p2ps[client],
            runner=runner,
            clients=topology.n,
            timeout=30,
        )
        for client in range(topology.n)
    ]
    for transport in transports:
        transport.start()
    return transports


def test_four_peers_on_a_ring_flood_like_the_simulator(peers) -> None:
    runner, p2ps = peers
    topology = make_topology("ring", 4)
    transports = started_transports(runner, p2ps, topology)
    states = [FloodState(c, topology.neighbors[c]) for c in range(topology.n)]
    simulated_states = [FloodState(c, topology.neighbors[c]) for c in range(topology.n)]
    simulated = SimulatedNetwork(topology.neighbors)
    received: list[list[Message]] = [[] for _ in range(topology.n)]

    def peer_round(client: int, round_index: int) -> None:
        received[client] += flood([states[client]], transports[client], topology.diameter)[0]

    for round_index in range(3):
        for message in round_messages(round_index, topology.n):
            states[message.origin].originate(message)
            simulated_states[message.origin].originate(message)
        threads = [
            threading.Thread(target=peer_round, args=(c, round_index)) for c in range(topology.n)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        flood(simulated_states, simulated, topology.diameter)
    for client in range(topology.n):
        expected = [
            m for r in range(3) for m in round_messages(r, topology.n) if m.origin != client
        ]
        assert sorted(received[client]) == sorted(expected)
        assert transports[client].missing == []
        for (sender, receiver), edge in transports[client].counter.traffic.items():
            assert edge == simulated.traffic[(sender, receiver)]


def test_silent_and_vanished_neighbours_are_reported_not_waited_for(peers) -> None:
    runner, _ = peers
    first = runner.run(p2p_module.P2P.create())
    second = runner.run(p2p_module.P2P.create(initial_peers=runner.run(first.get_visible_maddrs())))

    def transport(me: int, p2p, other) -> PeerTransport:
        made = PeerTransport(
            me=me,
            neighbor_peers={1 - me: other.peer_id},
            p2p=p2p,
            runner=runner,
            clients=2,
            timeout=0.5,
        )
        made.start()
        return made

    talker = transport(0, first, second)
    transport(1, second, first)  # listens, never hops
    assert talker.hop({0: {1: [Message(0, 0, 1.0)]}}) == {}
    assert talker.missing == [(0, 1)] and talker.unreachable == []
    runner.run(second.shutdown())
    assert talker.hop({}) == {}
    assert talker.missing == [(0, 1), (1, 1)] and talker.unreachable == [(1, 1)]
    runner.run(first.shutdown())
