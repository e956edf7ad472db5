"""Removals need a majority of the members' signatures: no stranger, no lone member, no removed
member and no forwarder can evict anyone, and nothing malformed gets past parsing."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.peers.crypto import Context, public_hex
from seedflood.peers.removals import MAX_REMOVALS, Removal, quorum, read_removals

CONTEXT = Context.of("run", ["QmA", "QmB", "QmC", "QmD", "QmE"])


def _members(n: int) -> tuple[list[Ed25519PrivateKey], dict[int, str]]:
    keys = [Ed25519PrivateKey.generate() for _ in range(n)]
    return keys, {i: public_hex(k) for i, k in enumerate(keys)}


def test_a_removal_takes_effect_with_a_majority_of_the_others_and_not_before() -> None:
    keys, table = _members(5)
    voters = range(5)  # client 4 is removed: 4 voters, a majority is 3
    assert [quorum(n) for n in (1, 2, 3, 4, 7, 8)] == [1, 2, 2, 3, 4, 5]
    removal = Removal(4, 17)
    for by in (0, 1):
        removal = removal.signed(keys[by], CONTEXT, by)
        assert not removal.decided(CONTEXT, table.get, voters)
    # the removed client's own signature, a repeated signer or a stranger's key do not count
    padded = removal.signed(keys[4], CONTEXT, 4).signed(keys[0], CONTEXT, 0)
    assert not padded.decided(CONTEXT, table.get, voters)
    stranger = Ed25519PrivateKey.generate()
    assert not removal.signed(stranger, CONTEXT, 2).decided(CONTEXT, table.get, voters)
    decided = removal.merged(Removal(4, 17).signed(keys[3], CONTEXT, 3))
    assert decided.signers(CONTEXT, table.get) == {0, 1, 3}
    assert decided.decided(CONTEXT, table.get, voters)
    wire, bad = read_removals([decided.to_wire()])
    assert bad == 0 and wire == [decided] and wire[0].decided(CONTEXT, table.get, voters)
    # the same signatures say nothing of another step, client or run
    for other in (Removal(4, 16, decided.signatures), Removal(3, 17, decided.signatures)):
        assert not other.decided(CONTEXT, table.get, voters)
    assert not decided.decided(Context.of("run", ["QmX"]), table.get, voters)
    # signers the caller counts as no member (gone, unknown, keyless) do not count
    assert not decided.decided(CONTEXT, {1: table[1], 3: table[3], 2: ""}.get, voters)
    with pytest.raises(ValueError, match="one removal"):
        decided.merged(Removal(3, 17))


def test_malformed_removals_are_counted_and_dropped() -> None:
    keys, _ = _members(1)
    good = Removal(1, 3).signed(keys[0], CONTEXT, 0).to_wire()
    signature = good[2]
    junk = [
        [1, 3],
        [1, 3, signature, 9],
        [True, 3, signature],
        [-1, 3, signature],
        [1, 2**63, signature],
        [1, 3, []],
        [1, 3, [[0, "not base64!"]]],
        [1, 3, [[0, base64.b64encode(b"short").decode()]]],
        [1, 3, [[0, 7]]],
        [1, 3, [[True, signature[0][1]]]],
        "gone",
    ]
    parsed, bad = read_removals([good, *junk])
    assert [r.to_wire() for r in parsed] == [good] and bad == len(junk)
    assert read_removals(None) == ([], 0)
    assert read_removals({"1": 2}) == ([], 1)
    assert read_removals([good] * (MAX_REMOVALS + 1)) == ([], 1)
