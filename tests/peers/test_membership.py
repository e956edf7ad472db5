"""Peers of one run agree on an ordered membership through the DHT; a peer that stops renewing
drops out, and other runs do not mix in."""

from __future__ import annotations

import time

import pytest

hivemind = pytest.importorskip("hivemind", reason="membership tests need hivemind installed")
pytestmark = pytest.mark.slow  # real hivemind DHT nodes

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
