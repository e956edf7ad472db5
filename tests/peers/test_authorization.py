"""Who may hold a seat: with an allowlist, a key it does not name gets none, whoever sponsors it,
and every honest peer refuses the admission alike, so the run goes on without the stranger."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedflood.peers.roster import Members
from seedflood.peers.state import ADMISSION_DELAY_ROUNDS, NotAllowed
from seedflood.topology import make_topology
from tests.algorithms.test_seedflood import make_seedflood
from tests.peers.test_state import Cluster, tiny  # noqa: F401  (the fixture)

ALLOWED = frozenset({"key-0", "key-1", "key-2", "key-3"})


def test_a_key_off_the_allowlist_gets_no_seat_from_any_sponsor(tiny, tmp_path: Path) -> None:  # noqa: F811
    sim = make_seedflood(tiny, make_topology("ring", 3), hops=1)
    cluster = Cluster(sim, tmp_path, clients=3, allowed=ALLOWED)
    cluster.round(0)
    honest = cluster.states[0]
    with pytest.raises(NotAllowed, match="not in the run's allowlist"):
        honest.admit("peer-stranger", "key-stranger")
    assert honest.admit("peer-new", "key-3") == 3  # an allowed key is admitted as before
    # a sponsor that ignores the allowlist (its own state has none) admits a stranger anyway
    cluster.round(1)
    rogue = cluster.states[1]
    rogue.allowed = None
    assert rogue.admit("peer-stranger", "key-stranger") == 4
    cluster.round(2)
    first_step = 2 + ADMISSION_DELAY_ROUNDS
    for state in (cluster.states[0], cluster.states[2]):
        assert state.members.seats[3].key == "key-3" and 4 not in state.members.seats
        assert state.refused_admissions == 1
        assert state.members.expected(first_step) == [0, 1, 2, 3]
    assert rogue.members.seats[4].key == "key-stranger"
    assert rogue.members.expected(first_step) == [0, 1, 2, 3, 4]
    assert Members.from_json(cluster.states[2].members.to_json()).seats.keys() == {0, 1, 2, 3}


def test_a_second_process_on_one_state_dir_is_refused_before_it_starts(tmp_path: Path) -> None:
    """Two processes of one identity would sign two versions of each batch: the state dir's
    lock stops the second at once."""
    import fcntl

    from seedflood.config import load_config
    from seedflood.peers.node import Node, PeerError, PeerOptions

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    with (state_dir / "lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        options = PeerOptions(run_id="run", state_dir=state_dir, out_dir=tmp_path, device="cpu")
        node = Node(load_config(None, ["model=tiny"]), options, say=lambda text: None)
        with pytest.raises(PeerError, match="another peer is running on state dir"):
            node.start()
