"""A peer's snapshot only shortens the replay after a restart: one that is cut short, damaged,
hostile or ahead of the log is set aside and the model rebuilt from the log alone, so a restarted
peer ends on the same state hash as its neighbours and never applies a step twice."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest
import torch

from seedflood.learning.models import load_model
from seedflood.protocol.ledger import LOG
from seedflood.topology import make_topology
from tests.algorithms.test_seedflood import make_seedflood
from tests.peers.test_state import Cluster

pytestmark = pytest.mark.usefixtures("one_thread")
ROUNDS = 5  # 2 steps of 4 messages a round; snapshots every 4 steps: after steps 3 and 7


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def cluster_of(tiny, root: Path, rounds: int) -> tuple[Cluster, list[str]]:
    """A 4-peer run of ``rounds`` rounds with every log closed, and peer 0's hash after each."""
    topology = make_topology("ring", 4)
    sim = make_seedflood(tiny, topology, hops=topology.diameter, local_steps=2)
    cluster = Cluster(sim, root, clients=4)
    hashes = []
    for round_index in range(rounds):
        cluster.round(round_index)
        hashes.append(cluster.states[0].state_hash())
    for state in cluster.states.values():
        state.log.close()
    assert len(set(cluster.hashes())) == 1
    return cluster, hashes


def last_record(path: Path) -> tuple[int, int]:
    """(start, end) of the payload of the log's last record."""
    data, offset, frame = path.read_bytes(), 0, struct.Struct("<II")
    while True:
        length, _ = frame.unpack_from(data, offset)
        start, offset = offset + frame.size, offset + frame.size + length
        if offset == len(data):
            return start, offset


def flip_bit(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.fixture
def run(tiny, tmp_path: Path) -> tuple[Cluster, list[str]]:
    return cluster_of(tiny, tmp_path, ROUNDS)


@pytest.mark.slow
def test_an_intact_snapshot_shortens_the_replay(run) -> None:
    cluster, hashes = run
    restarted = cluster.make(0)
    assert restarted.replayed == 8  # the snapshot after 32 messages, then the last 2 steps
    assert restarted.state_hash() == hashes[-1] and restarted.committed_step == 9


@pytest.mark.parametrize("damage", ["truncated", "bit flip", "empty"])
def test_a_damaged_snapshot_is_set_aside_for_the_log(run, damage: str, caplog) -> None:
    cluster, hashes = run
    path = cluster.root / "peer0" / "snapshot.pt"
    size = path.stat().st_size
    if damage == "truncated":
        os.truncate(path, size // 2)
    elif damage == "bit flip":
        flip_bit(path, size - size // 3)  # inside the matrices' bytes, before the zip directory
    else:
        path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="seedflood.peers.snapshot"):
        restarted = cluster.make(0)
    assert "ignoring the snapshot" in caplog.text
    assert ("checksum" in caplog.text) == (damage == "bit flip")
    assert restarted.replayed == 4 * 2 * ROUNDS  # the whole log
    assert restarted.state_hash() == hashes[-1] and restarted.committed_step == 9


class Hostile:
    """Unpickled, it would create a file: what a crafted snapshot could do with torch.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_snapshot_with_pickled_code_runs_nothing(run, tmp_path: Path) -> None:
    cluster, hashes = run
    marker = tmp_path / "ran"
    torch.save({"logged": 0, "matrices": [Hostile(marker)]}, cluster.root / "peer0/snapshot.pt")
    restarted = cluster.make(0)
    assert not marker.exists()
    assert restarted.replayed == 40 and restarted.state_hash() == hashes[-1]


def test_a_snapshot_ahead_of_a_damaged_log_applies_no_step_twice(tiny, tmp_path: Path) -> None:
    """Four rounds: the snapshot after step 7 covers all 32 messages. The log's last record
    (steps 6 and 7) is damaged and dropped as a torn tail: the snapshot is ahead of the log and
    is set aside, so peer 0 restarts at step 5 and takes steps 6 and 7 once, from a neighbour."""
    cluster, hashes = cluster_of(tiny, tmp_path, 4)
    start, end = last_record(tmp_path / "peer0" / LOG)
    flip_bit(tmp_path / "peer0" / LOG, (start + end) // 2)
    restarted = cluster.make(0)
    assert restarted.replayed == 24 and restarted.committed_step == 5
    assert restarted.state_hash() == hashes[2]  # the log alone, as after round 3

    messages, carried = cluster.states[1].held_since(6)
    restarted.receive(messages, carried)
    assert restarted.commit() == 2
    assert restarted.state_hash() == hashes[3] == cluster.states[1].state_hash()
