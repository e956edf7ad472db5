"""Liveness among real peers: one member that goes silent (alive, its DHT record renewed, no
messages) is removed by a signed majority of the others, who finish on one model, delayed by
a bounded wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.peers.launch import merge_results
from seedflood.peers.options import SILENT_VARIABLE
from seedflood.protocol.message_log import MessageLog
from tests.peers.test_node import PacedPeers, write_config

pytestmark = pytest.mark.slow  # eight real `seedflood peer` processes

PEERS, SILENT, SILENT_ROUND, ROUNDS = 8, 5, 10, 30


def test_a_silent_member_is_removed_by_quorum_and_the_others_finish_on_one_hash(
    data_dir, tmp_path: Path
) -> None:
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=PEERS, rounds=ROUNDS)
    root = tmp_path / "out"
    with PacedPeers(config_file, "silent", root) as peers:
        for k in range(PEERS):
            peers.start(k, {SILENT_VARIABLE: str(SILENT_ROUND)} if k == SILENT else None)
        for k in range(PEERS):
            if k != SILENT:
                assert peers.processes[k].wait(timeout=900) == 0
        assert peers.processes[SILENT].poll() is None  # still alive, and silent
    survivors = [peers.dir(k) for k in range(PEERS) if k != SILENT]
    results = merge_results(root, survivors)
    assert results["consensus"], [p["state_hash"] for p in results["peers"]]
    assert all(p["committed_step"] == ROUNDS - 1 for p in results["peers"])
    silent = json.loads((peers.dir(SILENT) / "state" / "peer.json").read_text())["index"]
    for directory in survivors:
        seats = json.loads((directory / "state" / "members.json").read_text())
        assert seats[str(silent)]["gone_from"] == SILENT_ROUND
        peer = json.loads((directory / "results.json").read_text())
        decided = peer["removals"]["decided"]
        assert [(d["client"], d["from_step"]) for d in decided] == [(silent, SILENT_ROUND)]
        assert len(decided[0]["signers"]) >= (PEERS - 1) // 2 + 1
        assert peer["longest_stall_seconds"] < 60.0
    log = MessageLog(survivors[0] / "state" / "messages.log").messages(0)
    assert {m.step for m in log if m.origin == silent} == set(range(SILENT_ROUND))
    assert all(
        sorted(m.origin for m in log if m.step == t) == [i for i in range(PEERS) if i != silent]
        for t in range(SILENT_ROUND, ROUNDS)
    )
    print(
        "removal: longest stall per survivor (s):",
        [
            round(json.loads((d / "results.json").read_text())["longest_stall_seconds"], 1)
            for d in survivors
        ],
    )
