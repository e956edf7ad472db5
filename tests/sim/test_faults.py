"""Faulty links in the simulator: loss, duplication, reordering, delay and a partition leave the
committed state as it would be without them, once anti-entropy has repaired what they broke."""

from __future__ import annotations

import pickle

import pytest

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.config import ConfigError, RunConfig
from seedflood.learning.models import load_model
from seedflood.protocol.messages import Message
from seedflood.sim.faults import FaultyNetwork, LinkFaults, cut_edges
from seedflood.topology import Topology, make_topology
from tests.algorithms.test_seedflood import make_seedflood

FLOOD_KEYS = ("bytes_per_edge_max", "bytes_per_edge_mean", "messages_per_edge_max", "bytes_total")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def trained(tiny, topology: Topology, rounds: int, faults: LinkFaults | None, **kw) -> SeedFlood:
    sim = make_seedflood(tiny, topology, kw.pop("hops", topology.diameter), faults=faults, **kw)
    for round_index in range(rounds):
        sim.run_round(round_index)
    return sim


def holds_everything(sim: SeedFlood, steps: int) -> bool:
    return not sim.pending and sim.committed_step == steps - 1 and sim.pending_held() == 0


def test_twenty_percent_loss_on_a_ring_of_16_ends_with_the_loss_free_hash(tiny) -> None:
    ring = make_topology("ring", 16)
    clean = trained(tiny, ring, 6, None, batched=True)
    lossy = trained(tiny, ring, 6, LinkFaults(loss=0.2, seed=1), batched=True)
    assert holds_everything(lossy, 6)
    assert lossy.state_hash() == clean.state_hash()
    described, traffic = lossy.describe(), lossy.traffic()
    assert described["faults_injected"]["loss"] > 100
    assert described["repair_exchanges_max"] >= 2
    assert described["rounds_without_full_delivery"] == 0
    assert traffic["repair_bytes_per_edge_max"] > 0 and traffic["repaired_messages"] > 0
    assert traffic["bytes_per_edge_max"] < clean.traffic()["bytes_per_edge_max"]
    assert clean.traffic()["repair_bytes_per_edge_max"] == 0.0


@pytest.mark.slow  # 100 rounds
def test_a_partition_of_40_steps_heals_to_one_hash(tiny) -> None:
    # 40 steps span 13 subspace refreshes (every 3 steps here); no limit of the repair's
    # digests is near (a gap bitmap holds 524,288 steps), so a longer cut adds only time.
    ring = make_topology("ring", 8)
    cut = LinkFaults(cut_rounds=(5, 45), cut_edges=cut_edges(ring, None))
    sim = make_seedflood(tiny, ring, ring.diameter, faults=cut, batched=True)
    for round_index in range(45):
        sim.run_round(round_index)
    # Each side trained on its own messages: 40 steps of the other side's 4 clients are missing.
    assert sim.committed_step == 4
    assert sim.pending_held() == 8 * 40 * 4
    assert sim.consensus_distance() > 0
    assert sim.describe()["full_delivery_round"] is None
    for round_index in range(45, 50):
        sim.run_round(round_index)
    assert holds_everything(sim, 50) and sim.clients_identical()
    described = sim.describe()
    assert described["full_delivery_round"] == 45
    assert described["rounds_without_full_delivery"] == 40
    assert sim.repair is not None and sim.repair.exchanges[45] == 2
    # The sides computed their scalars on different models during the cut, so the healed state
    # is a different (single) state from the uncut run's.
    uncut = trained(tiny, ring, 50, None, batched=True)
    assert described["state_hash"] != uncut.state_hash()


@pytest.mark.parametrize(
    ("faults", "hops"),
    [
        (LinkFaults(duplicate=0.5, seed=2), None),
        (LinkFaults(reorder=0.5, seed=3), None),
        (LinkFaults(delay=0.3, delay_hops=2, seed=4), None),
        (LinkFaults(delay=0.3, duplicate=0.2, reorder=0.3, loss=0.1, seed=5), 2),
    ],
)
def test_duplication_reordering_and_delay_keep_the_fault_free_state(
    tiny, faults: LinkFaults, hops: int | None
) -> None:
    ring = make_topology("ring", 16)
    hops = hops or ring.diameter
    clean = trained(tiny, ring, 6, None, hops=hops)
    faulty = trained(tiny, ring, 6, faults, hops=hops)
    assert faulty.state_hash() == clean.state_hash()
    assert faulty.committed_step == clean.committed_step
    # With fewer hops than the diameter, repair delivers exactly on flooding's schedule.
    assert [faulty.held(c) for c in range(16)] == [clean.held(c) for c in range(16)]


def test_no_faults_change_nothing(tiny) -> None:
    ring = make_topology("ring", 8)
    plain = trained(tiny, ring, 4, None)
    zero = trained(tiny, ring, 4, LinkFaults())
    assert zero.state_hash() == plain.state_hash()
    assert {k: zero.traffic()[k] for k in FLOOD_KEYS} == {k: plain.traffic()[k] for k in FLOOD_KEYS}
    assert zero.traffic()["repair_bytes_per_edge_max"] == 0.0
    assert zero.describe()["repair_exchanges_max"] == 0
    assert LinkFaults.from_config(RunConfig(clients=8, n_train=8), ring) is None


def test_cut_edges_must_be_edges_of_the_graph() -> None:
    ring = make_topology("ring", 8)
    config = RunConfig(clients=8, n_train=8, cut_rounds=(1, 3), cut_edges=((0, 4),))
    with pytest.raises(ConfigError, match=r"edge \[0, 4\] is not an edge of the ring graph of 8"):
        LinkFaults.from_config(config, ring)
    with pytest.raises(ConfigError, match="'cut_edges' needs the key 'cut_rounds'"):
        LinkFaults.from_config(RunConfig(clients=8, n_train=8, cut_edges=((0, 1),)), ring)
    default = LinkFaults.from_config(RunConfig(clients=8, n_train=8, cut_rounds=(1, 3)), ring)
    assert default is not None and default.cut_edges == {(0, 7), (3, 4)}
    with pytest.raises(ConfigError, match="loss rate must be in"):
        LinkFaults(loss=1.0)


def packets_on(network: FaultyNetwork, hops: int) -> list[list[tuple[int, int]]]:
    """Who received from whom on each of ``hops`` hops of one message per edge and hop."""
    arrivals = []
    for hop in range(hops):
        outboxes = {
            s: {r: [Message(hop, s, 1.0)] for r in row} for s, row in enumerate(network.neighbors)
        }
        delivered = network.hop(outboxes)
        arrivals.append([(s, r) for r in sorted(delivered) for s, _ in delivered[r]])
    return arrivals


def test_link_faults_are_seeded_per_edge_and_survive_pickling() -> None:
    ring = make_topology("ring", 16)
    faults = LinkFaults(loss=0.25, duplicate=0.1, delay=0.2, delay_hops=3, seed=9)
    first = FaultyNetwork(ring.neighbors, faults)
    head = packets_on(first, 50)
    copy = pickle.loads(pickle.dumps(first))
    assert packets_on(first, 50) == packets_on(copy, 50)
    again = FaultyNetwork(ring.neighbors, faults)
    assert packets_on(again, 50) == head
    sent = 100 * 32
    assert 0.2 * sent < first.injected["loss"] < 0.3 * sent
    assert first.injected["duplicate"] > 0 and first.in_flight > 0


def test_a_delayed_packet_arrives_delay_hops_later() -> None:
    triangle = make_topology("ring", 3)
    network = FaultyNetwork(triangle.neighbors, LinkFaults(delay=1.0, delay_hops=2))
    first = network.hop({0: {1: [Message(0, 0, 1.0)]}})
    second = network.hop({})
    third = network.hop({})
    assert first == {} and second == {} and third == {1: [(0, [Message(0, 0, 1.0)])]}
