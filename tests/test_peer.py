"""Real peers over hivemind end on the simulator's model bit for bit, and restart from their
snapshot and log, or from the log alone."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
from test_p2p import started_transports
from test_seedflood import make_seedflood

from seedflood.models import load_model
from seedflood.msglog import MessageLog
from seedflood.topology import make_topology
from seedflood.zo import make_direction

p2p_module = pytest.importorskip("hivemind.p2p", reason="real-peer tests need hivemind installed")

from seedflood.p2p import EventLoopThread  # noqa: E402
from seedflood.peer import Peer, state_hash  # noqa: E402

ROUNDS = 4


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def test_four_peers_match_the_simulator_and_a_restart_replays_the_log(tiny, tmp_path: Path) -> None:
    topology = make_topology("ring", 4)
    sim = make_seedflood(tiny, topology, hops=topology.diameter)
    initial = copy.deepcopy(sim.model)
    runner = EventLoopThread()
    first = runner.run(p2p_module.P2P.create())
    bootstrap = runner.run(first.get_visible_maddrs())
    p2ps = [first, *(runner.run(p2p_module.P2P.create(initial_peers=bootstrap)) for _ in range(3))]

    def make_peer(client: int, model, transport) -> Peer:
        return Peer(
            me=client,
            clients=topology.n,
            neighbors=topology.neighbors[client],
            model=model,
            direction=make_direction("subcge", model, rank=8, refresh=3, run_seed=11),
            shard=sim.shards[client],
            pad_id=sim.pad_id,
            transport=transport,
            log=MessageLog(tmp_path / f"peer{client}" / "messages.log", sync_every=1000),
            lr=sim.lr,
            eps=sim.eps,
            batch_size=sim.batch_size,
            hops=topology.diameter,
            scalar_format=sim.scalar_format,
            run_seed=sim.run_seed,
            snapshot_every=3,
        )

    try:
        peers = [
            make_peer(client, copy.deepcopy(initial), transport)
            for client, transport in enumerate(started_transports(runner, p2ps, topology))
        ]

        def run(peer: Peer) -> None:
            for round_index in range(ROUNDS):
                peer.run_round(round_index)

        threads = [threading.Thread(target=run, args=(peer,)) for peer in peers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for round_index in range(ROUNDS):
            sim.run_round(round_index)
        expected = state_hash(sim.direction.matrices)
        assert (
            state_hash(make_direction("subcge", initial, rank=8, refresh=3, run_seed=11).matrices)
            != expected
        )
        assert [peer.state_hash() for peer in peers] == [expected] * topology.n
        assert all(peer.committed_step == ROUNDS - 1 for peer in peers)
        for peer in peers:
            peer.log.close()
        restarted = make_peer(0, copy.deepcopy(initial), peers[0].transport)
        assert len(restarted.log) == ROUNDS * topology.n
        # the snapshot after 3 steps, then the log's last step
        assert restarted.replayed == topology.n
        assert restarted.state_hash() == expected and restarted.committed_step == ROUNDS - 1
        (tmp_path / "peer0" / "snapshot.pt").unlink()
        from_log_alone = make_peer(0, copy.deepcopy(initial), peers[0].transport)
        assert from_log_alone.replayed == ROUNDS * topology.n
        assert from_log_alone.state_hash() == expected
    finally:
        for p2p in p2ps:
            runner.run(p2p.shutdown())
        runner.stop()
