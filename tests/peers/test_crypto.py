"""Signed batches and the door, in one process: a valid batch passes; a forged, a subset, an
outsider's, an equivocating and a replayed batch are each refused under their own reason, counted,
and whoever delivered them is banned; keys survive a restart."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.peers.crypto import (
    KEY_FILE,
    SIGNATURE_BYTES,
    Context,
    KeyFileError,
    SignedBatch,
    load_or_create_key,
    public_hex,
)
from seedflood.peers.inbox import BatchStore, Door, Verdict, batch_body, batch_header, read_batches
from seedflood.peers.p2p import Frame
from seedflood.peers.roster import Members
from seedflood.protocol.messages import Message

STEPS = 2  # steps per round
RUN = Context.of("run", ["peer-0", "peer-1", "peer-2"])


@pytest.fixture
def keys() -> list[Ed25519PrivateKey]:
    return [Ed25519PrivateKey.generate() for _ in range(3)]


@pytest.fixture
def members(keys) -> Members:
    return Members.initial([f"peer-{i}" for i in range(3)], [public_hex(k) for k in keys])


def batch(origin: int, round_index: int, scalars=(0.5, -0.25), controls=None) -> SignedBatch:
    steps = range(round_index * STEPS, round_index * STEPS + len(scalars))
    messages = tuple(Message(step, origin, s) for step, s in zip(steps, scalars, strict=True))
    return SignedBatch(origin, round_index, messages, controls or {})


def over_the_wire(batches: list[SignedBatch], context: Context = RUN):
    """What a receiver rebuilds from the frame a sender makes of ``batches``."""
    frame = Frame.decode(
        Frame(batch_header(context, batches), batch_body(batches, "fp32")).encode()
    )
    return read_batches(frame.header, frame.body, STEPS)


def test_a_valid_batch_with_its_controls_passes_and_a_repeat_is_a_duplicate(keys, members) -> None:
    door = Door(RUN, STEPS)
    controls = {(2, 1): [{"kind": "hash", "step": 1, "hash": "ab" * 32}]}
    sent = batch(1, 1, controls=controls).sign(keys[1], RUN)
    assert len(sent.signature) == SIGNATURE_BYTES
    stated, [received] = over_the_wire([sent])
    assert stated == RUN and received.controls == controls
    assert door.judge("peer-1", stated, received, members, -1) is Verdict.ACCEPTED
    assert door.judge("peer-2", stated, received, members, -1) is Verdict.DUPLICATE
    assert door.since(2) == [received] and door.since(4) == []
    assert sum(door.rejected.values()) == 0 and not door.banned


@pytest.mark.parametrize(
    "tamper",
    ["flip a scalar bit", "wrong key", "change a control", "half the batch", "no signature"],
)
def test_a_forged_batch_is_refused_and_its_deliverer_banned(keys, members, tamper: str) -> None:
    door = Door(RUN, STEPS)
    controls = {(0, 0): [{"kind": "admit", "index": 3, "peer": "x", "first_step": 4, "key": ""}]}
    good = batch(0, 0, controls=controls).sign(keys[0], RUN)
    sent = [good]
    if tamper == "flip a scalar bit":
        sent = [batch(0, 0, (0.5, -0.2500001), controls)]
        sent[0].signature = good.signature
    elif tamper == "wrong key":
        sent = [batch(0, 0, controls=controls).sign(keys[1], RUN)]
    elif tamper == "change a control":
        sent = [batch(0, 0, controls={(0, 0): [{**controls[(0, 0)][0], "key": "ff" * 32}]})]
        sent[0].signature = good.signature
    elif tamper == "half the batch":
        sent = [batch(0, 0, (0.5,), controls)]
        sent[0].signature = good.signature
    elif tamper == "no signature":
        good.signature = b""
    stated, [received] = over_the_wire(sent)
    assert door.judge("peer-2", stated, received, members, -1) is Verdict.FORGED
    assert door.rejected == {"replayed": 0, "not_member": 0, "forged": 1, "equivocation": 0}
    assert list(door.banned) == ["peer-2"] and door.since(0) == []


def test_an_equivocating_origin_is_refused_and_its_evidence_kept(keys, members) -> None:
    door = Door(RUN, STEPS)
    first = batch(2, 3).sign(keys[2], RUN)
    other = batch(2, 3, (0.5, 0.75)).sign(keys[2], RUN)
    assert door.judge("peer-1", RUN, first, members, -1) is Verdict.ACCEPTED
    assert door.judge("peer-2", RUN, other, members, -1) is Verdict.EQUIVOCATION
    assert door.rejected["equivocation"] == 1
    # an honest forwarder may hold either version, and the run still needs the origin's other
    # messages until it is removed: no one is banned, the two versions are the evidence
    assert not door.banned
    assert door.equivocations[2].proves(RUN, members.seats[2].key)
    assert (door.equivocations[2].first, door.equivocations[2].second) == (first, other)
    forwarded = batch(2, 4).sign(keys[2], RUN), batch(2, 4, (1.0, 1.0)).sign(keys[2], RUN)
    assert door.judge("peer-2", RUN, forwarded[0], members, -1) is Verdict.ACCEPTED
    assert door.judge("peer-0", RUN, forwarded[1], members, -1) is Verdict.EQUIVOCATION
    assert not door.banned and door.since(8) == [forwarded[0]]
    assert door.equivocations[2].round == 3  # the first evidence is kept


def test_a_batch_of_another_run_or_an_earlier_run_of_the_same_name_is_replayed(
    keys, members
) -> None:
    door = Door(RUN, STEPS)
    for context in (Context.of("other", ["peer-0", "peer-1", "peer-2"]), Context.of("run", ["p"])):
        stated, [received] = over_the_wire([batch(0, 0).sign(keys[0], context)], context)
        assert stated == context
        assert door.judge("peer-1", stated, received, members, -1) is Verdict.REPLAYED
    assert door.rejected["replayed"] == 2 and list(door.banned) == ["peer-1"]
    # a stated context that the signature does not match either is a forgery, not a replay
    other = Context.of("other", ["q"])
    stated, [received] = over_the_wire([batch(0, 0).sign(keys[0], RUN)], other)
    assert door.judge("peer-0", stated, received, members, -1) is Verdict.FORGED


def test_an_outsiders_batch_waits_for_an_admission_then_is_refused(keys, members) -> None:
    door = Door(RUN, STEPS)
    outsider = Ed25519PrivateKey.generate()
    early = batch(5, 1).sign(outsider, RUN)
    assert door.judge("peer-1", RUN, early, members, committed_step=0) is Verdict.WAITING
    assert door.settle(members, committed_step=1) == [] and door.waiting
    assert not door.banned
    assert door.settle(members, committed_step=2) == []
    assert door.rejected["not_member"] == 1 and list(door.banned) == ["peer-1"]
    # a batch of steps before its origin's first step is refused at once
    joined = Members({**members.seats})
    joined.seats[6] = members.seats[0].__class__("peer-6", 6, key=public_hex(outsider))
    assert door.judge("peer-0", RUN, batch(6, 1).sign(outsider, RUN), joined, 0) is (
        Verdict.NOT_MEMBER
    )
    # a joiner whose admission arrives after its first batch is let in by settle
    waiting = batch(7, 3).sign(outsider, RUN)
    assert door.judge("peer-2", RUN, waiting, joined, 3) is Verdict.WAITING
    joined.seats[7] = members.seats[0].__class__("peer-7", 6, key=public_hex(outsider))
    assert door.settle(joined, 3) == [waiting] and door.rejected["not_member"] == 2


def test_keys_persist_across_restarts_and_a_bad_key_file_is_named(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path / "state")
    path = tmp_path / "state" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_hex(load_or_create_key(tmp_path / "state")) == public_hex(key)
    assert public_hex(load_or_create_key(tmp_path / "other")) != public_hex(key)
    path.write_bytes(b"short")
    with pytest.raises(KeyFileError, match="holds 5 bytes; an Ed25519 key file holds exactly 32"):
        load_or_create_key(tmp_path / "state")


def test_the_batch_store_survives_a_torn_last_line(keys, tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "batches.jsonl")
    saved = [batch(0, 0).sign(keys[0], RUN), batch(1, 0, controls={(0, 1): [{"kind": "x"}]})]
    store.add(saved)
    with store.path.open("a") as file:
        file.write('{"o": 2, "r"')
    loaded = store.load()
    assert [(b.origin, b.messages, b.controls, b.signature) for b in loaded] == [
        (b.origin, b.messages, b.controls, b.signature) for b in saved
    ]
