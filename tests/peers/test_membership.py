"""Peers of one run agree on an ordered membership through the DHT; a peer that stops renewing
drops out, and other runs do not mix in."""

from __future__ import annotations

import time

import pytest

hivemind = pytest.importorskip("hivemind", reason="membership tests need hivemind installed")
# real hivemind DHT nodes, marked to run one test at a time (see the Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_peers")]

from seedflood.peers.membership import Member, Membership, MembershipError  # noqa: E402


def test_peers_agree_on_the_ordered_membership_and_see_leavers_go() -> None:
    first = hivemind.DHT(start=True)
    others = [hivemind.DHT(initial_peers=first.get_visible_maddrs(), start=True) for _ in range(2)]
    stranger = hivemind.DHT(initial_peers=first.get_visible_maddrs(), start=True)
    dhts = [first, *others]
    try:
        views = [Membership(dht, "run-a", ttl=3.0, key=f"{i:064x}") for i, dht in enumerate(dhts)]
        for view in views:
            view.announce()
        Membership(stranger, "run-b", ttl=3.0).announce()
        lists = [view.initial(3, timeout=20) for view in views]
        assert lists == [[v.me.peer_id for v in views]] * 3
        views[2].announce(index=2, done=True)
        assert views[0].members()[2] == Member(
            views[2].me.joined, views[2].me.peer_id, 2, True, f"{2:064x}"
        )
        # a record of an older peer, without its key, still counts (with no key)
        old = Membership(stranger, "run-a", ttl=3.0)
        stranger.store(old.key, [old.me.joined, -1, False], old._now() + 3.0, subkey="QmOld")
        assert [m.key for m in views[0].members() if m.peer_id == "QmOld"] == [""]
        late = Membership(first, "run-a")
        assert late.initial(5, timeout=0.5) == lists[0]  # published: nobody recounts
        with pytest.raises(MembershipError, match="1 of 2 peers announced themselves"):
            Membership(stranger, "run-b").initial(2, timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for view in views[:2]:
                view.announce()
            if len(views[0].members()) == 2:
                break
            time.sleep(0.5)
        assert [m.peer_id for m in views[1].members()] == [v.me.peer_id for v in views[:2]]
    finally:
        for dht in [*dhts, stranger]:
            dht.shutdown()


def test_bad_run_ids_and_ttls_are_refused() -> None:
    class FakeDHT:
        peer_id = None

    with pytest.raises(ValueError, match="run id must be a non-empty name without '/'"):
        Membership(FakeDHT(), "a/b")
    with pytest.raises(ValueError, match="ttl must be positive"):
        Membership(FakeDHT(), "run", ttl=0)


def test_a_node_without_the_key_cannot_rewrite_add_or_prolong_run_records() -> None:
    """Honest DHT nodes run `OwnedRecords`; a rogue node runs none and stores what it likes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from seedflood.peers.crypto import public_hex
    from seedflood.peers.membership import owned_subkey
    from seedflood.peers.records import OwnedRecords

    keys = [Ed25519PrivateKey.generate() for _ in range(2)]
    allowed = {public_hex(k) for k in keys}
    first = hivemind.DHT(start=True, record_validators=[OwnedRecords("run", keys[0], allowed)])
    second = hivemind.DHT(
        initial_peers=first.get_visible_maddrs(),
        start=True,
        record_validators=[OwnedRecords("run", keys[1], allowed)],
    )
    rogue = hivemind.DHT(initial_peers=first.get_visible_maddrs(), start=True)
    try:
        views = [
            Membership(dht, "run", ttl=30.0, key=public_hex(k))
            for dht, k in zip([first, second], keys, strict=True)
        ]
        for view in views:
            assert view.announce(index=views.index(view))
        honest = [view.initial(2, timeout=20) for view in views]
        assert honest[0] == honest[1] == [v.me.peer_id for v in views]
        now = views[0]._now()
        victim = views[1].me
        # overwrite the victim's record, add a member "joined at 0", rewrite the initial list
        rogue.store(
            views[0].key, [now, 7, True, victim.key], now + 24 * 3600, subkey=views[1].subkey
        )
        stranger = public_hex(Ed25519PrivateKey.generate())
        rogue.store(
            views[0].key,
            [0.0, -1, False, stranger],
            now + 30,
            subkey=owned_subkey("QmRogue", stranger),
        )
        rogue.store(views[0].key, [0.0, -1, False, ""], now + 30, subkey="QmBare")
        rogue.store(views[0].initial_key, ["QmRogue"], now + 30, subkey="QmRogue")
        rogue.store(views[0].initial_key, ["QmRogue"], now + 30)
        for view in views:
            members = view.members()
            assert [(m.peer_id, m.index, m.done, m.key) for m in members] == [
                (v.me.peer_id, i, False, v.me.key) for i, v in enumerate(views)
            ]
            assert view._published() == honest[0]
            assert (
                Membership(first, "run", key=public_hex(keys[0])).initial(5, timeout=1) == honest[0]
            )
    finally:
        for dht in [first, second, rogue]:
            dht.shutdown()
