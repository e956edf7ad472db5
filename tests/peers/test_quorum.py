"""A member that goes silent is removed by a signed majority of the others, and the run goes on
on one model; no lone member, stranger or impatient proposer can remove anyone."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.peers.crypto import Context, public_hex
from seedflood.peers.p2p import Frame
from seedflood.peers.quorum import Quorum
from seedflood.peers.removals import Removal, read_removals
from seedflood.topology import make_topology
from tests.algorithms.test_seedflood import make_seedflood
from tests.peers.test_state import Cluster, tiny  # noqa: F401  (the fixture)

CLIENTS = 5
SILENT = 4


def _quorums(cluster: Cluster, keys: list[Ed25519PrivateKey], banned: dict) -> dict[int, Quorum]:
    context = Context.of("run", [f"peer-{i}" for i in range(CLIENTS)])
    for state in cluster.states.values():
        for index, seat in state.members.seats.items():
            seat.key = public_hex(keys[index])
    live = {f"peer-{i}" for i in range(CLIENTS)}
    return {
        i: Quorum(
            cond=threading.Condition(),
            state=state,
            door=SimpleNamespace(banned=banned),
            context=context,
            signing_key=keys[i],
            say=lambda text: None,
            live_ids=lambda: live,
        )
        for i, state in cluster.states.items()
    }


def _ask(quorums: dict[int, Quorum], caller: int, counts: list[int]):
    """The proposer's link: each request reaches the voter's handler as from ``caller``."""

    def ask(peer_id: str, data: bytes) -> bytes | None:
        counts.append(1)
        return quorums[int(peer_id.split("-")[1])].on_decide(f"peer-{caller}", data)

    return ask


def test_a_silent_member_is_removed_by_a_majority_and_the_rest_agree(
    tiny,  # noqa: F811
    tmp_path: Path,
) -> None:
    sim = make_seedflood(tiny, make_topology("ring", CLIENTS), hops=1)
    cluster = Cluster(sim, tmp_path, clients=CLIENTS)
    keys = [Ed25519PrivateKey.generate() for _ in range(CLIENTS)]
    quorums = _quorums(cluster, keys, banned={})
    for round_index in range(2):
        cluster.round(round_index)
    cluster.round(2, who=[0, 1, 2, 3])  # client 4 goes silent
    assert all(cluster.states[i].missing() == [SILENT] for i in range(4))
    for quorum in quorums.values():
        quorum.patience, quorum.stalled_since = 10.0, 0.0
    # too early, or not the lowest member present: nobody proposes
    assert not quorums[0].should_propose(now=5.0)
    assert not quorums[1].should_propose(now=20.0)
    assert quorums[0].should_propose(now=20.0)
    # a voter that has not waited half the patience itself refuses to sign
    quorums[3].stalled_since = 18.0
    quorums[0].propose()
    asked: list[int] = []
    decided = quorums[0].gather(quorums[0].open[SILENT], _ask(quorums, 0, asked))
    assert decided is not None and decided.signers(quorums[0].context, quorums[0]._key_of) == {
        0,
        1,
        2,
    }
    assert len(asked) == 2  # a majority of the 4 voters (3) after asking two of them
    # the decision floods: each peer checks the signatures against its own table and takes it
    wire = Frame({"removals": [decided.to_wire()]}).encode()
    for i in range(1, 4):
        found = Frame.decode(wire).header["removals"]
        removals, bad = read_removals(found)
        quorums[i].take(removals)
        assert bad == 0 and SILENT in quorums[i].decided
    states = [cluster.states[i] for i in range(4)]
    assert all(s.members.seats[SILENT].gone_from == 2 * s.local_steps for s in states)
    for state in states:
        state.commit()
    for round_index in range(3, 6):
        cluster.round(round_index, who=[0, 1, 2, 3])
    assert len({s.state_hash() for s in states}) == 1
    assert {s.committed_step for s in states} == {6 * states[0].local_steps - 1}
    assert not any(s.divergences for s in states)


def test_no_lone_member_stranger_or_holder_can_remove_anyone(tiny, tmp_path: Path) -> None:  # noqa: F811
    sim = make_seedflood(tiny, make_topology("ring", CLIENTS), hops=1)
    cluster = Cluster(sim, tmp_path, clients=CLIENTS)
    keys = [Ed25519PrivateKey.generate() for _ in range(CLIENTS)]
    quorums = _quorums(cluster, keys, banned={})
    cluster.round(0)
    context = quorums[0].context
    # every voter holds client 4's messages: a lone member's signed removal is refused by all,
    # and a removal with one signature is not taken from a flood
    lone = Removal(SILENT, 0).signed(keys[1], context, 1)
    for i in (0, 2, 3):
        reply = Frame.decode(
            quorums[i].on_decide("peer-1", Frame({"removal": lone.to_wire()}).encode())
        )
        assert reply.header == {"refused": "step already committed"}
    assert quorums[0].take([lone]) == [] and quorums[0].counts["undecided_removal"] == 1
    # a proposal the caller did not sign (a stranger relaying a member's signature) is refused
    relayed = Frame.decode(
        quorums[2].on_decide("peer-stranger", Frame({"removal": lone.to_wire()}).encode())
    )
    assert relayed.header == {"refused": "not proposed by the caller"}
    # signatures of a stranger's keys under members' indices count for nothing
    forged = Removal(SILENT, 1)
    for by in (0, 1, 2):
        forged = forged.signed(Ed25519PrivateKey.generate(), context, by)
    assert quorums[3].take([forged]) == []
    cluster.round(1)
    assert all(s.members.seats[SILENT].gone_from is None for s in cluster.states.values())
    assert len({s.state_hash() for s in cluster.states.values()}) == 1
