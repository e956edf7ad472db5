"""A member that goes silent, or equivocates, is removed by a signed majority of the others, and
the run goes on on one model; no lone member, stranger, impatient proposer or false evidence can
remove anyone."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.peers.crypto import Context, SignedBatch, public_hex
from seedflood.peers.inbox import Door, Verdict, window_rounds
from seedflood.peers.p2p import Frame
from seedflood.peers.quorum import Quorum, equivocation_step
from seedflood.peers.removals import Equivocation, Removal, read_removals
from seedflood.topology import make_topology
from tests.algorithms.test_seedflood import make_seedflood
from tests.peers.test_state import Cluster, tiny  # noqa: F401  (the fixture)

CLIENTS = 5
SILENT = 4


def _quorums(
    cluster: Cluster, keys: list[Ed25519PrivateKey], banned: dict, doors: bool = False
) -> dict[int, Quorum]:
    """Each client's quorum; with ``doors``, each has a door of its own (evidence, bans)."""
    context = Context.of("run", [f"peer-{i}" for i in range(CLIENTS)])
    for state in cluster.states.values():
        for index, seat in state.members.seats.items():
            seat.key = public_hex(keys[index])
    live = {f"peer-{i}" for i in range(CLIENTS)}
    return {
        i: Quorum(
            cond=threading.Condition(),
            state=state,
            door=Door(context, state.local_steps) if doors else SimpleNamespace(banned=banned),
            context=context,
            signing_key=keys[i],
            say=lambda text: None,
            live_ids=lambda: live,
        )
        for i, state in cluster.states.items()
    }


def _run(tiny, tmp_path: Path, doors: bool = False):  # noqa: F811
    """A ring of CLIENTS peer states of one simulated run, their keys and quorums."""
    sim = make_seedflood(tiny, make_topology("ring", CLIENTS), hops=1)
    cluster = Cluster(sim, tmp_path, clients=CLIENTS)
    keys = [Ed25519PrivateKey.generate() for _ in range(CLIENTS)]
    return cluster, keys, _quorums(cluster, keys, banned={}, doors=doors)


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
    cluster, keys, quorums = _run(tiny, tmp_path)
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
    # a promise is not a decision: the proposer commits nothing from the removal's step on
    # until a majority signed (a proposer cut off from the others would go on alone)
    held = cluster.states[0].committed_step
    assert cluster.states[0].commit() == 0 and held == 2 * cluster.states[0].local_steps - 1
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
    # a restart forgets decisions: client 3's departures (from members.json) hold its commits
    # back until a decision comes again, in a sync reply
    cluster.states[3].undecided.clear()
    restarted = Quorum(
        cond=threading.Condition(),
        state=cluster.states[3],
        door=SimpleNamespace(banned={}),
        context=quorums[3].context,
        signing_key=keys[3],
        say=lambda text: None,
        live_ids=quorums[3].live_ids,
    )
    assert cluster.states[3].undecided == {SILENT: 2 * cluster.states[3].local_steps}
    assert cluster.states[3].commit() == 0
    assert restarted.take(removals) == removals and cluster.states[3].undecided == {}
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
    cluster, keys, quorums = _run(tiny, tmp_path)
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


EQUIVOCATOR = 4


def _equivocation(cluster: Cluster, quorums: dict[int, Quorum], key: Ed25519PrivateKey):
    """Client 4's messages of round 1, signed, and a second signed version with the scalars
    negated; the honest peers receive and commit the first."""
    messages, _ = cluster.states[EQUIVOCATOR].originate(1)
    context = quorums[0].context
    first = SignedBatch(EQUIVOCATOR, 1, tuple(messages)).sign(key, context)
    negated = tuple(replace(m, scalar=-m.scalar) for m in messages)
    return first, SignedBatch(EQUIVOCATOR, 1, negated).sign(key, context)


HONEST = [0, 1, 2, 3]


def _lied_in_round_1(tiny, tmp_path: Path):  # noqa: F811
    """A run whose client 4 signed two versions of round 1; the honest peers committed round 0
    and made round 1 holding the first version. The run, its quorums and both versions."""
    cluster, keys, quorums = _run(tiny, tmp_path, doors=True)
    cluster.round(0)
    first, second = _equivocation(cluster, quorums, keys[EQUIVOCATOR])
    cluster.deliver(EQUIVOCATOR, first.messages)
    cluster.round(1, who=HONEST)
    return cluster, quorums, first, second


@pytest.mark.slow
def test_an_equivocator_is_removed_with_its_evidence_and_the_rest_agree(
    tiny,  # noqa: F811
    tmp_path: Path,
) -> None:
    cluster, quorums, first, second = _lied_in_round_1(tiny, tmp_path)
    # client 0 gets both versions: its door keeps the evidence (and bans no one)
    door = quorums[0].door
    members, context = cluster.states[0].members, quorums[0].context
    assert door.judge("peer-1", context, first, members, 0) is Verdict.ACCEPTED
    assert door.judge("peer-2", context, second, members, 0) is Verdict.EQUIVOCATION
    assert not door.banned and door.equivocations[EQUIVOCATOR].proves(
        context, members.seats[EQUIVOCATOR].key
    )
    quorums[0].propose_equivocators()
    removal = quorums[0].open[EQUIVOCATOR]
    local_steps = cluster.states[0].local_steps
    assert removal.from_step == equivocation_step(removal.evidence, local_steps, 0)
    assert removal.from_step == (1 + 2 * window_rounds(0)) * local_steps
    # the evidence travels: voters that never saw the second version sign without waiting
    asked: list[int] = []
    decided = quorums[0].gather(removal, _ask(quorums, 0, asked))
    assert decided is not None and len(asked) == 2
    wire = Frame({"removals": [decided.to_wire()]}).encode()
    removals, bad = read_removals(Frame.decode(wire).header["removals"])
    assert bad == 0 and removals[0].evidence is not None
    for i in (1, 2, 3):
        quorums[i].take(removals)
        assert cluster.states[i].members.seats[EQUIVOCATOR].gone_from == removal.from_step
    assert EQUIVOCATOR in quorums[1].door.equivocations  # the evidence travelled
    # the equivocator's messages count until the removal's step, and not after
    for round_index in range(2, removal.from_step // local_steps):
        cluster.round(round_index)
    for round_index in range(
        removal.from_step // local_steps, removal.from_step // local_steps + 2
    ):
        cluster.round(round_index, who=HONEST)
    states = [cluster.states[i] for i in HONEST]
    assert len({s.state_hash() for s in states}) == 1
    assert {s.committed_step for s in states} == {removal.from_step + 2 * local_steps - 1}
    assert not any(s.divergences for s in states)
    record = quorums[2].record()["decided"][0]
    assert record["client"] == EQUIVOCATOR and record["evidence_round"] == 1


@pytest.mark.slow
def test_an_equivocator_that_falls_silent_before_its_removal_is_removed_again_earlier(
    tiny,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Removed from a step two windows ahead, the equivocator still owes the steps before it;
    # silent from the next round, it would stall every honest peer there for good.
    cluster, quorums, first, second = _lied_in_round_1(tiny, tmp_path)
    local_steps = cluster.states[0].local_steps
    context, members = quorums[0].context, cluster.states[0].members
    quorums[0].door.judge("peer-1", context, first, members, 0)
    quorums[0].door.judge("peer-2", context, second, members, 0)
    quorums[0].propose_equivocators()
    late = quorums[0].gather(quorums[0].open[EQUIVOCATOR], _ask(quorums, 0, []))
    assert late is not None and late.from_step > 2 * local_steps
    removals, _ = read_removals([late.to_wire()])
    for i in (1, 2, 3):
        quorums[i].take(removals)
    cluster.round(2, who=HONEST)  # client 4 owes its messages of round 2 and sends none
    states = [cluster.states[i] for i in HONEST]
    assert all(s.missing() == [EQUIVOCATOR] for s in states)
    for quorum in quorums.values():
        quorum.patience, quorum.stalled_since = 10.0, 0.0
    assert quorums[0].should_propose(now=20.0)
    quorums[0].propose()
    earlier = quorums[0].gather(quorums[0].open[EQUIVOCATOR], _ask(quorums, 0, []))
    assert earlier is not None and earlier.from_step == 2 * local_steps
    assert earlier.signers(context, quorums[0]._key_of) == {0, 1, 2}
    flooded, _ = read_removals([earlier.to_wire()])
    for i in (1, 2, 3):
        assert quorums[i].take(flooded) == flooded  # news: it supersedes the later removal
        assert quorums[i].take(removals) == []  # and the later one never comes back
    assert all(s.members.seats[EQUIVOCATOR].gone_from == 2 * local_steps for s in states)
    assert all(quorums[i].decided[EQUIVOCATOR].from_step == 2 * local_steps for i in HONEST)
    for state in states:
        state.commit()
    for round_index in range(3, late.from_step // local_steps + 2):
        cluster.round(round_index, who=HONEST)
    assert len({s.state_hash() for s in states}) == 1
    assert {s.committed_step for s in states} == {late.from_step + 2 * local_steps - 1}
    assert not any(s.divergences for s in states)


def test_false_or_misplaced_evidence_removes_no_one(tiny, tmp_path: Path) -> None:  # noqa: F811
    cluster, keys, quorums = _run(tiny, tmp_path, doors=True)
    cluster.round(0)
    context = quorums[0].context
    first, second = _equivocation(cluster, quorums, keys[EQUIVOCATOR])
    step = equivocation_step(Equivocation(first, second), cluster.states[0].local_steps, 0)
    forged = replace(second, signature=b"").sign(keys[1], context)  # a member's key, not 4's
    cases = {
        "the evidence proves no equivocation": [
            Removal(EQUIVOCATOR, step, evidence=Equivocation(first, forged)),
            Removal(EQUIVOCATOR, step, evidence=Equivocation(first, first)),
            Removal(3, step, evidence=Equivocation(first, second)),  # evidence against another
        ],
        "not the step the evidence fixes": [
            Removal(EQUIVOCATOR, step - 1, evidence=Equivocation(first, second))
        ],
    }
    for reason, removals in cases.items():
        for removal in removals:
            proposal = removal.signed(keys[0], context, 0)
            reply = quorums[1].on_decide("peer-0", Frame({"removal": proposal.to_wire()}).encode())
            assert Frame.decode(reply).header == {"refused": reason}
    assert quorums[1].counts["false_evidence"] == 3 and not quorums[1].door.banned
    assert all(s.gone_from is None for s in cluster.states[1].members.seats.values())
    # evidence that arrives after its step was committed is counted and proposes nothing
    quorums[2].door.equivocations[EQUIVOCATOR] = Equivocation(first, second)
    cluster.states[2].committed_step = step
    quorums[2].propose_equivocators()
    assert not quorums[2].open and quorums[2].counts["stale_evidence"] == 1


def test_a_proposer_promising_several_removals_decides_none_alone(tiny, tmp_path: Path) -> None:  # noqa: F811
    cluster, _, quorums = _run(tiny, tmp_path)
    cluster.round(0)
    cluster.round(1, who=[0, 1])  # clients 2, 3 and 4 go silent at once
    proposer = quorums[0]
    proposer.propose()
    assert sorted(proposer.open) == [2, 3, 4]
    for index, removal in proposer.open.items():
        # the proposer's own promises leave the electorate whole: 4 voters, 3 signatures needed
        assert proposer._voters(removal) == [i for i in range(CLIENTS) if i != index]
        assert proposer.gather(removal, lambda peer, data: None) is None
    assert proposer.decided == {} and proposer.counts["removal_short_of_quorum"] == 3


def test_a_removal_no_majority_can_sign_is_released_and_its_signers_go_on(
    tiny,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Client 4 is only slow: its messages of round 2 reach clients 2 and 3, which commit the
    # round, but not clients 0 and 1, which wait. Client 0 proposes its removal, client 1 signs,
    # clients 2 and 3 refuse for good: 2 of 4 voters committed the step, and a majority (3)
    # can spare only 1, so neither promise can ever be decided.
    cluster, _, quorums = _run(tiny, tmp_path)
    cluster.round(0)
    cluster.round(1)
    late, _ = cluster.states[SILENT].originate(2)
    for i in (2, 3):
        cluster.states[i].receive(late, {})
    cluster.round(2, who=[0, 1, 2, 3])
    local_steps = cluster.states[0].local_steps
    step = 2 * local_steps
    assert {cluster.states[i].committed_step for i in (2, 3, 4)} == {3 * local_steps - 1}
    assert cluster.states[0].missing() == cluster.states[1].missing() == [SILENT]
    for quorum in quorums.values():
        quorum.patience, quorum.stalled_since = 10.0, 0.0
    quorums[0].propose()
    assert quorums[0].gather(quorums[0].open[SILENT], _ask(quorums, 0, [])) is None
    # the proposer takes client 4 back; the co-signer still holds its promise and its ask
    seat = cluster.states[0].members.seats[SILENT]
    assert seat.gone_from is None and cluster.states[0].undecided == {}
    assert SILENT not in quorums[0].open and quorums[0].counts["removal_released"] == 1
    assert cluster.states[1].members.seats[SILENT].gone_from == step
    assert quorums[1].open[SILENT].from_step == step
    # client 0's pull brings the late messages; client 1's promise still drops them
    for i in (0, 1):
        cluster.states[i].receive(late, {})
        cluster.states[i].commit()
    assert cluster.states[0].committed_step == 3 * local_steps - 1
    assert cluster.states[1].committed_step == step - 1
    assert quorums[1].gather(quorums[1].open[SILENT], _ask(quorums, 1, [])) is None
    assert cluster.states[1].members.seats[SILENT].gone_from is None
    assert not quorums[1].promised and quorums[1].counts["removal_released"] == 1
    cluster.states[1].receive(late, {})
    cluster.states[1].commit()
    for round_index in range(3, 5):
        cluster.round(round_index)
    states = list(cluster.states.values())
    assert len({s.state_hash() for s in states}) == 1
    assert {s.committed_step for s in states} == {5 * local_steps - 1}
    assert not any(s.divergences for s in states)
    assert not any(q.decided for q in quorums.values())


def test_a_voter_asked_again_after_the_decision_answers_with_it_and_promises_nothing(
    tiny,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Several peers may propose one removal (every one that saw an equivocation does); one that
    # asks after another's proposal was decided must get the decision, not a fresh promise that
    # no decision would ever clear, holding the voter's commits back for good.
    cluster, keys, quorums = _run(tiny, tmp_path)
    cluster.round(0)
    cluster.round(1, who=[0, 1, 2, 3])
    for quorum in quorums.values():
        quorum.patience, quorum.stalled_since = 10.0, 0.0
    quorums[0].propose()
    decided = quorums[0].gather(quorums[0].open[SILENT], _ask(quorums, 0, []))
    assert decided is not None
    for i in (1, 2, 3):
        quorums[i].take(read_removals([decided.to_wire()])[0])
    assert all(cluster.states[i].undecided == {} for i in HONEST)
    late = Removal(SILENT, decided.from_step).signed(keys[3], quorums[0].context, 3)
    reply = quorums[1].on_decide("peer-3", Frame({"removal": late.to_wire()}).encode())
    [answer], _ = read_removals([Frame.decode(reply).header["removal"]])
    assert answer.signers(quorums[1].context, quorums[1]._key_of) == {0, 1, 2}
    assert cluster.states[1].undecided == {} and SILENT not in quorums[1].promised
    assert quorums[3].gather(late, _ask(quorums, 3, [])) is None  # decided here already
    assert cluster.states[3].undecided == {}
    for round_index in range(2, 4):
        cluster.round(round_index, who=HONEST)
    states = [cluster.states[i] for i in HONEST]
    assert {s.committed_step for s in states} == {4 * states[0].local_steps - 1}
    assert len({s.state_hash() for s in states}) == 1
