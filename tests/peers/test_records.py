"""Run records in the DHT: only their owner writes them, only allowed owners at all, no record
outlives its peer, and the initial list is the one its own members vouch for."""

from __future__ import annotations

import dataclasses
import pickle
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from seedflood.peers.crypto import public_hex
from seedflood.peers.membership import (
    AllowlistError,
    Membership,
    owned_subkey,
    read_allowlist,
    split_subkey,
)
from seedflood.peers.records import MAX_RECORD_SECONDS, OwnedRecords, record_key_ids

PEER = "QmVictim1111111111111111111111111111111111111"
ROGUE = "QmRogue22222222222222222222222222222222222222"


def _ids(run: str = "run") -> dict[str, bytes]:
    return {name: key_id for key_id, name in record_key_ids(run).items()}


def _record(
    key: Ed25519PrivateKey,
    value: object,
    *,
    name: str = "members",
    peer: str = PEER,
    owner: str | None = None,
    expires_in: float = 6.0,
) -> DHTRecord:
    subkey = owned_subkey(peer, owner or public_hex(key))
    return DHTRecord(
        _ids()[name],
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(value),
        time.time() + expires_in,
    )


def _signed(validator: OwnedRecords, record: DHTRecord) -> DHTRecord:
    return dataclasses.replace(record, value=validator.sign_value(record))


def test_an_owner_signs_its_record_and_no_one_else_can_write_or_change_it() -> None:
    victim, rogue = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    mine, theirs = OwnedRecords("run", victim), OwnedRecords("run", rogue)
    value = [100.0, 3, False, public_hex(victim)]
    record = _signed(mine, _record(victim, value))
    assert theirs.validate(record) and mine.validate(record)
    assert MSGPackSerializer.loads(mine.strip_value(record)) == value
    # the rogue writes the victim's subkey: it cannot sign it, and its own key signs nothing
    forged = _record(victim, [0.0, 3, False, public_hex(victim)])
    assert theirs.sign_value(forged) == forged.value
    assert not mine.validate(forged)
    with_rogue_signature = dataclasses.replace(forged, value=record.value[:-1] + b"x]")
    assert not mine.validate(with_rogue_signature)
    # a changed field, a changed expiry or the victim's signature on another subkey all fail
    changed = MSGPackSerializer.dumps([100.0, 4, False, public_hex(victim)])
    assert not mine.validate(dataclasses.replace(record, value=changed + record.value[-74:]))
    assert not mine.validate(
        dataclasses.replace(record, expiration_time=record.expiration_time + 1)
    )
    moved = dataclasses.replace(
        record, subkey=MSGPackSerializer.dumps(owned_subkey(ROGUE, public_hex(victim)))
    )
    assert not mine.validate(moved)


def test_records_that_outlive_their_peer_name_another_key_or_are_junk_are_refused() -> None:
    key = Ed25519PrivateKey.generate()
    validator = OwnedRecords("run", key)
    me = public_hex(key)
    good = [1.0, -1, False, me, {"digest": "0" * 64, "values": {}}]
    assert validator.validate(_signed(validator, _record(key, good)))
    day = _signed(validator, _record(key, good, expires_in=24 * 3600))
    assert not validator.validate(day)
    assert validator.validate(
        _signed(validator, _record(key, good, expires_in=MAX_RECORD_SECONDS - 5))
    )
    other_key = [1.0, -1, False, "ab" * 32]
    assert not validator.validate(_signed(validator, _record(key, other_key)))
    for junk in (
        [float("inf"), 0, False, me],
        [1.0, True, False, me],
        [1.0, 2**40, False, me],
        "x",
    ):
        assert not validator.validate(_signed(validator, _record(key, junk))), junk
    bare = dataclasses.replace(_record(key, good), subkey=MSGPackSerializer.dumps(PEER))
    assert not validator.validate(_signed(validator, bare))
    assert not validator.validate(DHTRecord(_ids()["members"], b"\xc1", b"\xc1", time.time()))
    # another run's keys and hivemind's own records are none of this validator's business
    elsewhere = DHTRecord(_ids("other")["members"], b"x", b"y", time.time() + 10**6)
    assert validator.validate(elsewhere)


def test_an_allowlist_keeps_strangers_records_out_even_when_signed() -> None:
    member, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    allowed = {public_hex(member)}
    honest = OwnedRecords("run", member, allowed)
    theirs = OwnedRecords("run", stranger, allowed)
    own = _signed(honest, _record(member, [1.0, 0, False, public_hex(member)]))
    foreign = _signed(theirs, _record(stranger, [0.0, -1, False, public_hex(stranger)], peer=ROGUE))
    assert honest.validate(own) and not honest.validate(foreign)
    initial = _signed(theirs, _record(stranger, [ROGUE], name="initial", peer=ROGUE))
    assert not honest.validate(initial)
    assert OwnedRecords("run", member).validate(foreign)  # an open run takes any signed record
    # hivemind pickles validators into its DHT process: the copy judges alike and still signs
    copy = pickle.loads(pickle.dumps(honest))
    assert copy.validate(own) and not copy.validate(foreign)
    assert copy.validate(_signed(copy, _record(member, [2.0, 0, True, public_hex(member)])))


def test_owned_subkeys_round_trip_and_anything_else_is_not_one() -> None:
    key = "cd" * 32
    assert split_subkey(owned_subkey(PEER, key)) == (PEER, key)
    for other in (
        PEER,
        f"{PEER}[owner:{key[:-2]}]",
        f"{PEER}[owner:{key}]x",
        7,
        None,
        f"[owner:{key}]",
    ):
        assert split_subkey(other) is None


def test_allowlists_are_read_with_comments_and_bad_lines_are_named(tmp_path: Path) -> None:
    first, second = (public_hex(Ed25519PrivateKey.generate()) for _ in range(2))
    good = tmp_path / "allow"
    good.write_text(f"# the run's peers\n{first}\n\n{second.upper()}  # peer 1\n")
    assert read_allowlist(good) == {first, second}
    bad = tmp_path / "bad"
    bad.write_text(f"{first}\nnot-a-key\n")
    with pytest.raises(
        AllowlistError, match=r"bad, line 2: 'not-a-key' is not an Ed25519 public key"
    ):
        read_allowlist(bad)
    empty = tmp_path / "empty"
    empty.write_text("# nobody\n")
    with pytest.raises(AllowlistError, match="names no key"):
        read_allowlist(empty)
    with pytest.raises(AllowlistError, match="cannot read the allowlist"):
        read_allowlist(tmp_path / "missing")


class _Found:
    def __init__(self, value: object) -> None:
        self.value = value


class _FakeDHT:
    """What `Membership` reads of hivemind's DHT: values by subkey, as a get returns them."""

    class _Id:
        def to_base58(self) -> str:
            return "QmReader"

    peer_id = _Id()

    def __init__(self) -> None:
        self.records: dict[str, dict[str, _Found]] = {}

    def get(self, key: str, latest: bool = True) -> _Found | None:
        found = self.records.get(key)
        return None if found is None else _Found(found)


def test_the_initial_list_is_the_one_most_of_its_own_members_vouch_for() -> None:
    dht = _FakeDHT()
    view = Membership(dht, "run", key="ab" * 32)
    honest = ["QmA", "QmB", "QmC"]
    rewritten = ["QmX", "QmY", "QmZ"]
    dht.records[view.initial_key] = {
        owned_subkey("QmA", "01" * 32): _Found(honest),
        owned_subkey("QmB", "02" * 32): _Found(honest),
        owned_subkey("QmX", "03" * 32): _Found(rewritten),
        # a stranger's list that it is not in counts for nothing, however many copies
        owned_subkey("QmS", "04" * 32): _Found(["QmS1", "QmS2", "QmS3"]),
        owned_subkey("QmT", "05" * 32): _Found(["QmS1", "QmS2", "QmS3"]),
        owned_subkey("QmU", "06" * 32): _Found(["QmS1", "QmS2", "QmS3"]),
    }
    assert view.initial(3, timeout=0.1) == honest
    dht.records[view.initial_key] = {owned_subkey("QmS", "04" * 32): _Found(["QmS1"])}
    assert view._published() is None


def test_launch_writes_its_peers_keys_as_the_allowlist_and_hands_it_to_each(
    tmp_path: Path,
) -> None:
    from seedflood.peers.crypto import load_or_create_key
    from seedflood.peers.launch import peer_command, write_allowlist

    state_dirs = [tmp_path / "peers" / str(k) / "state" for k in range(3)]
    path = write_allowlist(tmp_path / "allowlist", state_dirs)
    keys = [public_hex(load_or_create_key(d)) for d in state_dirs]
    assert read_allowlist(path) == set(keys) and len(set(keys)) == 3
    assert write_allowlist(tmp_path / "again", state_dirs).read_text() == path.read_text()
    command = peer_command(Path("c.yaml"), run_id="r", directory=tmp_path, allow=path)
    assert command[command.index("--allow") + 1] == str(path)


def test_a_bad_allowlist_stops_a_peer_before_it_starts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from seedflood.cli import app

    bad = tmp_path / "allow"
    bad.write_text("zz\n")
    result = CliRunner().invoke(
        app, ["peer", "configs/peers.yaml", "--run-id", "r", "--allow", str(bad)]
    )
    assert result.exit_code == 2
    assert "line 1: 'zz' is not an Ed25519 public key" in " ".join(result.output.split())
