"""Peer states handing messages to each other in one process: they end on the simulator's model
bit for bit (built from one config on one device, too), restart from their logs, admit a late
joiner, survive a departure, and report a divergence when there is one."""

from __future__ import annotations

import copy
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.build import Parts, build_parts, run_direction, run_precision
from seedflood.config import RunConfig, load_config
from seedflood.learning.models import load_model
from seedflood.peers.batch_exchange import Exchange
from seedflood.peers.crypto import Context, SignedBatch, public_hex
from seedflood.peers.inbox import BatchStore, Door, batch_body, batch_header
from seedflood.peers.node import Node, PeerOptions, peer_state
from seedflood.peers.p2p import Frame
from seedflood.peers.quorum import Quorum
from seedflood.peers.roster import Members
from seedflood.peers.state import ADMISSION_DELAY_ROUNDS, PeerState, state_hash
from seedflood.protocol.guard import DivergenceGuard
from seedflood.sim.runner import build
from seedflood.topology import make_topology
from seedflood.zo import make_direction
from tests.algorithms.test_seedflood import make_seedflood


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


class Cluster:
    """Peer states of one run; `deliver` hands a peer's new messages to every other peer, as
    flooding with hops = diameter does."""

    def __init__(self, sim: SeedFlood, root: Path, *, clients: int, **kw) -> None:
        self.sim, self.root, self.kw = sim, root, kw
        self.initial = copy.deepcopy(sim.model)
        self.members = Members.initial([f"peer-{i}" for i in range(clients)])
        self.states = {i: self.make(i) for i in range(clients)}

    def make(self, index: int, members: Members | None = None) -> PeerState:
        model = copy.deepcopy(self.initial)
        return PeerState(
            me=index,
            members=copy.deepcopy(members or self.members),
            model=model,
            direction=make_direction("subcge", model, rank=8, refresh=3, run_seed=11),
            shard=self.sim.shards[index % self.sim.n],
            pad_id=self.sim.pad_id,
            state_dir=self.root / f"peer{index}",
            clients=self.sim.n,
            lr=self.sim.lr,
            eps=self.sim.eps,
            batch_size=self.sim.batch_size,
            local_steps=self.sim.local_steps,
            scalar_format=self.sim.scalar_format,
            run_seed=self.sim.run_seed,
            **{"staleness": 0, "hash_every": 2, "snapshot_every": 4, **self.kw},
        )

    def round(self, round_index: int, who: list[int] | None = None) -> None:
        for index in who if who is not None else sorted(self.states):
            sender = self.states[index]
            messages, _ = sender.originate(round_index)
            self.deliver(index, messages)
        for state in self.states.values():
            state.commit()

    def deliver(self, index: int, messages) -> None:
        sender = self.states[index]
        carried = {m.key: sender.carried[m.key] for m in messages if m.key in sender.carried}
        for other, state in self.states.items():
            if other != index:
                state.receive(messages, carried)

    def hashes(self) -> list[str]:
        return [state.state_hash() for state in self.states.values()]


@pytest.mark.slow
def test_peers_match_the_simulator_and_restart_from_their_logs(tiny, tmp_path: Path) -> None:
    topology = make_topology("ring", 4)
    sim = make_seedflood(tiny, topology, hops=topology.diameter, local_steps=2)
    cluster = Cluster(sim, tmp_path, clients=4)
    for round_index in range(5):
        cluster.round(round_index)
        sim.run_round(round_index)
    expected = state_hash(sim.direction.matrices)
    assert (
        state_hash(
            make_direction("subcge", cluster.initial, rank=8, refresh=3, run_seed=11).matrices
        )
        != expected
    )
    assert cluster.hashes() == [expected] * 4
    states = list(cluster.states.values())
    assert all(s.committed_step == 9 and not s.pending and not s.divergences for s in states)
    # hashes ride on messages every 2 rounds, and every peer checked the others' claims
    assert sorted(states[0].hashes) == [3, 7]
    for state in states:
        state.log.close()
    restarted = cluster.make(0)
    # the snapshot after 8 steps, then the log's last 2 steps of 4 messages
    assert restarted.replayed == 8
    assert restarted.state_hash() == expected and restarted.committed_step == 9
    (tmp_path / "peer0" / "snapshot.pt").unlink()
    from_log_alone = cluster.make(0)
    assert from_log_alone.replayed == 40 and from_log_alone.state_hash() == expected
    assert from_log_alone.own_rounds_done() == 5


class ConfigCluster(Cluster):
    """Peer states built from a run config as a `seedflood peer` process builds them: the run's
    parts on the peer's device, each peer training its own copy of the model."""

    def __init__(self, config: RunConfig, parts: Parts, sim: SeedFlood, root: Path) -> None:
        self.config, self.parts = config, parts
        super().__init__(sim, root, clients=config.clients)

    def make(self, index: int, members: Members | None = None) -> PeerState:
        own = replace(self.parts, model=copy.deepcopy(self.parts.model))
        return peer_state(
            self.config,
            own,
            run_direction(self.config, own.model),
            me=index,
            members=copy.deepcopy(members or self.members),
            state_dir=self.root / f"peer{index}",
        )


NEEDS_CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: peers and simulator on cuda"
)


@pytest.mark.parametrize(
    ("device", "dtype"),
    [
        ("cpu", "fp32"),
        ("cpu", "bf16"),
        pytest.param("cuda", "fp32", marks=NEEDS_CUDA),
        pytest.param("cuda", "bf16", marks=NEEDS_CUDA),
    ],
)
@pytest.mark.slow
def test_peers_on_a_device_commit_the_simulators_model_there(
    device: str, dtype: str, data_dir: Path, tmp_path: Path, one_thread
) -> None:
    """`seedflood peer --device D` and the simulator on D, from one config (batched forwards off:
    a peer computes one client at a time) and in its precision: the same model bit for bit."""
    config = load_config(
        None,
        [
            "model=tiny",
            f"data_dir={data_dir}",
            "clients=3",
            "rounds=3",
            "rank=8",
            "batch_size=4",
            "n_train=24",
            "n_val=4",
            "n_test=4",
            "batched_forward=false",
            f"dtype={dtype}",
        ],
    )
    options = PeerOptions(run_id="run", state_dir=tmp_path, out_dir=tmp_path, device=device)
    chosen = Node(config, options, say=print).device
    with chosen, run_precision(config, chosen):  # as run_peer and the simulator's run enter them
        sim = build(config, chosen).algorithm
        assert isinstance(sim, SeedFlood)
        cluster = ConfigCluster(config, build_parts(config, chosen), sim, tmp_path)
        base = sim.state_hash()
        for round_index in range(config.rounds):
            cluster.round(round_index)
            sim.run_round(round_index)
    assert next(cluster.states[0].model.parameters()).device.type == device
    assert sim.state_hash() != base
    assert cluster.hashes() == [sim.state_hash()] * config.clients


def catch_up(joiner: PeerState, sponsor: PeerState) -> None:
    """What a joining or restarted peer does first: take the sponsor's members and every message
    it has beyond this peer's committed prefix, then commit."""
    joiner.learn(sponsor.members)
    joiner.receive(*sponsor.held_since(joiner.committed_step + 1))
    joiner.commit()


def test_a_late_joiner_catches_up_by_replay_and_trains_with_the_others(
    tiny, tmp_path: Path
) -> None:
    sim = make_seedflood(tiny, make_topology("ring", 3), hops=1)
    cluster = Cluster(sim, tmp_path, clients=3)
    for round_index in range(3):
        cluster.round(round_index)
    sponsor = cluster.states[0]
    assert sponsor.admit("peer-new") == 3
    assert sponsor.admit("peer-new") == 3  # asking twice: one seat
    cluster.round(3, who=[0, 1, 2])  # the sponsor's round-3 message carries the admission
    first_step = 3 + ADMISSION_DELAY_ROUNDS
    assert sponsor.members.seats[3].first_step == first_step
    joiner = cluster.make(3, members=Members({}))
    catch_up(joiner, sponsor)
    assert joiner.committed_step == 3 and joiner.state_hash() == sponsor.state_hash()
    cluster.states[3] = joiner
    assert all(s.members.expected(first_step) == [0, 1, 2, 3] for s in cluster.states.values())
    cluster.round(4, who=[0, 1, 2])
    assert joiner.own_rounds_done() == 0
    for round_index in range(5, 8):
        cluster.round(round_index)
    states = list(cluster.states.values())
    assert all(s.committed_step == 7 and not s.divergences for s in states)
    assert len(set(cluster.hashes())) == 1
    assert all(s.committed == sponsor.committed for s in states)
    assert [m.origin for m in sponsor.committed if m.step == 7] == [0, 1, 2, 3]


def test_a_departed_peer_is_declared_gone_and_the_rest_agree(tiny, tmp_path: Path) -> None:
    sim = make_seedflood(tiny, make_topology("ring", 4), hops=1)
    cluster = Cluster(sim, tmp_path, clients=4)
    for round_index in range(3):
        cluster.round(round_index)
    cluster.round(3, who=[0, 1, 2])  # client 3 crashed before making step 3
    assert all(s.missing() == [3] for i, s in cluster.states.items() if i != 3)
    gone_from = cluster.states[0].last_step_of(3) + 1
    assert gone_from == 3
    del cluster.states[3]
    for state in cluster.states.values():
        assert state.depart(3, gone_from)
        assert not state.depart(3, gone_from)  # news only once
        state.commit()
    for round_index in range(4, 6):
        cluster.round(round_index)
    states = list(cluster.states.values())
    assert all(s.committed_step == 5 and not s.divergences for s in states)
    assert len(set(cluster.hashes())) == 1
    assert [m.origin for m in states[0].committed if m.step >= 3] == [0, 1, 2] * 3
    # a peer that had committed a message of client 3 past the declared step says so
    late = states[1]
    late.depart(0, 4)
    assert late.divergences == [
        "client 0 was declared gone from step 4, but this peer already committed its message of "
        "step 4"
    ]


def test_a_tampered_model_is_reported_through_the_hash_claims(tiny, tmp_path: Path) -> None:
    sim = make_seedflood(tiny, make_topology("ring", 3), hops=1)
    reports: list[str] = []
    cluster = Cluster(sim, tmp_path, clients=3, on_divergence=reports.append)
    cluster.round(0)
    cluster.states[2].direction.matrices[0].data[0, 0] += 1.0
    for round_index in range(1, 4):
        cluster.round(round_index)
    assert reports and all("after step 1" in text or "after step 3" in text for text in reports)
    assert any(text.startswith("client 2 committed state") for text in reports)
    assert cluster.states[2].divergences and cluster.states[0].divergences


def test_with_staleness_peers_run_ahead_and_still_commit_the_same_model(
    tiny, tmp_path: Path
) -> None:
    sim = make_seedflood(tiny, make_topology("ring", 3), hops=1)
    cluster = Cluster(sim, tmp_path, clients=3, staleness=1)
    states = cluster.states
    assert states[0].ready_for(1) and not states[0].ready_for(2)
    for round_index in range(2):  # round 1 starts before round 0 is committed
        for index, state in states.items():
            cluster.deliver(index, state.originate(round_index)[0])
    assert all(s.committed_step == -1 for s in states.values())
    for state in states.values():
        state.commit()
    for round_index in range(2, 5):
        cluster.round(round_index)
    assert all(s.committed_step == 4 for s in states.values())
    assert len(set(cluster.hashes())) == 1


class FakeLink:
    """Records what a host pushes instead of sending it."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, Frame]] = []

    def push(self, messages_for: dict[str, bytes]) -> set[str]:
        self.pushed += [(peer, Frame.decode(data)) for peer, data in messages_for.items()]
        return set(messages_for)


class Wiring:
    """Neighbours without a membership: a banned peer just drops out."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.neighbors = {1: "peer-1", 2: "peer-2"}

    def rewire(self) -> None:
        self.neighbors = {i: p for i, p in self.neighbors.items() if p not in self.door.banned}


def quorum_of(
    cond: threading.Condition,
    state: PeerState,
    door: Door,
    context: Context,
    key: Ed25519PrivateKey,
) -> Quorum:
    """A peer's part in removals, on its own table and door; every member counts as live."""
    return Quorum(
        cond=cond,
        state=state,
        door=door,
        context=context,
        signing_key=key,
        say=lambda text: None,
        live_ids=lambda: {seat.peer_id for seat in state.members.seats.values()},
    )


def host(state: PeerState, key: Ed25519PrivateKey, context: Context, root: Path) -> Exchange:
    """The flooding part of a peer process around one `PeerState`, without a network."""
    door, cond = Door(context, state.local_steps), threading.Condition()
    return Exchange(
        config=load_config(None, ["scalar_format=fp32"]),
        cond=cond,
        link=FakeLink(),  # type: ignore[arg-type]
        wiring=Wiring(door),
        state=state,
        door=door,
        store=BatchStore(root / "batches.jsonl"),
        context=context,
        signing_key=key,
        quorum=quorum_of(cond, state, door, context, key),
    )


def test_a_peer_floods_only_signed_batches_and_bans_whoever_delivers_a_forgery(
    tiny, tmp_path: Path
) -> None:
    sim = make_seedflood(tiny, make_topology("ring", 3), hops=1, local_steps=2)
    cluster = Cluster(sim, tmp_path, clients=3)
    keys = [Ed25519PrivateKey.generate() for _ in range(3)]
    for state in cluster.states.values():
        for index, key in enumerate(keys):
            state.members.seats[index].key = public_hex(key)
    context = Context.of("run", [f"peer-{i}" for i in range(3)])
    hosts = [host(cluster.states[i], keys[i], context, tmp_path / f"host{i}") for i in range(3)]
    messages, _ = cluster.states[1].originate(0)
    batch = hosts[1].sign_own(0, messages)
    frame = Frame(batch_header(context, [batch]), batch_body([batch], "fp32"))
    assert hosts[0].take("peer-1", frame) == 2
    # pushed on whole, with its origin's signature, to every neighbour but the sender
    [(target, forwarded)] = hosts[0].link.pushed
    assert target == "peer-2" and forwarded == frame
    assert hosts[0].take("peer-2", frame) == 0 and len(hosts[0].link.pushed) == 1
    # peer-2 forwards a copy with one scalar changed: refused, counted, peer-2 banned
    messages, _ = cluster.states[2].originate(0)
    honest = hosts[2].sign_own(0, messages)
    forged = SignedBatch(2, 0, (messages[0], replace(messages[1], scalar=1.0)), {}, b"")
    forged.signature = honest.signature
    frame = Frame(batch_header(context, [forged]), batch_body([forged], "fp32"))
    assert hosts[0].take("peer-2", frame) == 0
    assert hosts[0].door.rejected["forged"] == 1 and list(hosts[0].door.banned) == ["peer-2"]
    assert hosts[0].wiring.neighbors == {1: "peer-1"}
    # a banned peer's frames are dropped unread, even valid ones; the same batch via peer-1 is in
    valid = Frame(batch_header(context, [honest]), batch_body([honest], "fp32"))
    assert hosts[0].take("peer-2", valid) == 0 and 2 not in hosts[0].state.pending.get(0, {})
    assert hosts[0].take("peer-1", valid) == 2 and hosts[0].state.pending[1][2] == messages[1]
    own = hosts[0].sign_own(0, cluster.states[0].originate(0)[0])
    hosts[0].push(dict(hosts[0].wiring.neighbors), [own], [])
    assert [target for target, _ in hosts[0].link.pushed] == ["peer-2", "peer-1"]
    # what it holds, it serves whole and signed: a restarted peer loads it from the store
    assert [b.signature for b in BatchStore(tmp_path / "host0" / "batches.jsonl").load()] == [
        batch.signature,
        honest.signature,
        own.signature,
    ]


@pytest.mark.slow
def test_the_guard_stops_every_peer_at_the_same_step_as_the_simulator(tiny, tmp_path: Path) -> None:
    topology = make_topology("ring", 4)
    guard = {"factor": 8.0, "window": 100, "warmup": 5}
    sim = make_seedflood(tiny, topology, hops=topology.diameter, lr=30.0)
    sim.guard = DivergenceGuard(**guard)
    cluster = Cluster(sim, tmp_path, clients=4, guard=DivergenceGuard(**guard))
    # each peer state gets its own guard: they must refuse the same step independently
    for index in (1, 2, 3):
        cluster.states[index].guard = DivergenceGuard(**guard)
    for round_index in range(200):
        sim.run_round(round_index)
        cluster.round(round_index)
        if sim.tripped is not None:
            break
    assert sim.tripped is not None
    stops = {state.tripped.step for state in cluster.states.values() if state.tripped}
    assert stops == {sim.tripped.step} and len(cluster.states) == 4
    assert cluster.hashes() == [sim.state_hash()] * 4
    for state in cluster.states.values():
        state.log.close()
    cluster.kw["guard"] = DivergenceGuard(**guard)
    restarted = cluster.make(2)  # the log holds the steps before; the guard replays quietly
    assert restarted.state_hash() == sim.state_hash() and restarted.tripped is None
