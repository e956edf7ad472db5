"""Liveness among real peers: one member that goes silent (alive, its DHT record renewed, no
messages) is removed by a signed majority of the others, who finish on one model, delayed by
a bounded wait; one that equivocates is removed with the evidence, without a wait, and is told
so, and stops; one that equivocates and then falls silent before its removal's step is removed
again from where its silence starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.config import load_config
from seedflood.peers.inbox import window_rounds
from seedflood.peers.launch import merge_results
from seedflood.peers.options import EQUIVOCATE_VARIABLE, SILENT_VARIABLE
from seedflood.protocol.message_log import MessageLog
from tests.peers.test_node import PacedPeers, write_config

# eight real `seedflood peer` processes, marked to run one test at a time (see the Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_peers")]

PEERS, SILENT, SILENT_ROUND, ROUNDS = 8, 5, 10, 30


def run_with_one_faulty(
    config_file: Path, root: Path, peers_n: int, faulty: int, fault: dict[str, str]
) -> list[Path]:
    """Run ``peers_n`` paced peers, peer ``faulty`` with the ``fault`` environment, until every
    other one has finished (each with exit code 0); their directories. A faulty peer that still
    pulls learns of its removal and stops with exit code 2 (an error); a silent one never
    hears of it."""
    with PacedPeers(config_file, root.name, root) as peers:
        for k in range(peers_n):
            peers.start(k, fault if k == faulty else None)
        for k in range(peers_n):
            if k != faulty:
                assert peers.exit_code(k, timeout=900) == 0
        if SILENT_VARIABLE in fault:
            assert peers.processes[faulty].poll() is None  # alive: it misbehaves, not crashes
        else:
            assert peers.exit_code(faulty, timeout=120) == 2  # an error, told
    for k in range(peers_n):  # nobody waited for the removed member, which never finishes
        assert k == faulty or "stopped waiting" not in (peers.dir(k) / "peer.log").read_text()
    return [peers.dir(k) for k in range(peers_n)]


def test_a_silent_member_is_removed_by_quorum_and_the_others_finish_on_one_hash(
    data_dir, tmp_path: Path
) -> None:
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=PEERS, rounds=ROUNDS)
    root = tmp_path / "silent"
    dirs = run_with_one_faulty(
        config_file, root, PEERS, SILENT, {SILENT_VARIABLE: str(SILENT_ROUND)}
    )
    survivors = [d for k, d in enumerate(dirs) if k != SILENT]
    results = merge_results(root, survivors)
    assert results["consensus"], [p["state_hash"] for p in results["peers"]]
    assert all(p["committed_step"] == ROUNDS - 1 for p in results["peers"])
    silent = json.loads((dirs[SILENT] / "state" / "peer.json").read_text())["index"]
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


def test_an_equivocating_member_is_removed_with_its_evidence_and_nothing_else_differs(
    data_dir, tmp_path: Path
) -> None:
    peers_n, liar, lie_round = 5, 2, 5
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=peers_n, rounds=20)
    config = load_config(config_file, [])
    local_steps = config.steps_per_round
    cut = (lie_round + 2 * window_rounds(config.staleness)) * local_steps
    root = tmp_path / "equivocation"
    fault = {EQUIVOCATE_VARIABLE: str(lie_round)}
    dirs = run_with_one_faulty(config_file, root, peers_n, liar, fault)
    survivors = [d for k, d in enumerate(dirs) if k != liar]
    index = json.loads((dirs[liar] / "state" / "peer.json").read_text())["index"]
    results = [json.loads((d / "results.json").read_text()) for d in survivors]
    assert all(r["committed_step"] == config.rounds * local_steps - 1 for r in results)
    for directory, peer in zip(survivors, results, strict=True):
        seats = json.loads((directory / "state" / "members.json").read_text())
        assert seats[str(index)]["gone_from"] == cut
        decided = peer["removals"]["decided"]
        assert [(d["client"], d["from_step"], d["evidence_round"]) for d in decided] == [
            (index, cut, lie_round)
        ]
        assert peer["longest_stall_seconds"] < 30.0
    told = " ".join((dirs[liar] / "peer.log").read_text().split())
    why = f"it signed two versions of its batch of round {lie_round}"
    assert f"client {index} was removed from the run from step {cut}: {why}" in told, told[-2000:]
    # the survivors differ in nothing but the version of the lie each committed first
    lies, hashes = [], []
    for directory, peer in zip(survivors, results, strict=True):
        log = MessageLog(directory / "state" / "messages.log").messages(0)
        assert {m.step for m in log if m.origin == index} == set(range(cut))
        lie = [m.scalar for m in log if m.origin == index and m.step // local_steps == lie_round]
        lies.append(tuple(lie))
        hashes.append(peer["state_hash"])
    assert len({tuple(abs(s) for s in lie) for lie in lies}) == 1  # one lie, told two ways
    assert len(set(hashes)) == len(set(lies))
    detected = sum(r["rejected"]["equivocation"] for r in results)
    print(f"equivocation: versions committed {len(set(lies))}, detections {detected}")


def test_an_equivocator_that_falls_silent_before_its_removal_does_not_stall_the_run(
    data_dir, tmp_path: Path
) -> None:
    # Its evidence removes it from step cut, two windows past the lie, so it still owes the
    # steps before; silent from two rounds after the lie, it is removed again from there.
    peers_n, liar, lie_round, silent_round = 5, 2, 5, 7
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=peers_n, rounds=20)
    config = load_config(config_file, [])
    cut = (lie_round + 2 * window_rounds(config.staleness)) * config.steps_per_round
    fault = {EQUIVOCATE_VARIABLE: str(lie_round), SILENT_VARIABLE: str(silent_round)}
    dirs = run_with_one_faulty(config_file, tmp_path / "lie-then-silence", peers_n, liar, fault)
    survivors = [d for k, d in enumerate(dirs) if k != liar]
    index = json.loads((dirs[liar] / "state" / "peer.json").read_text())["index"]
    for directory in survivors:
        peer = json.loads((directory / "results.json").read_text())
        assert peer["committed_step"] == config.rounds * config.steps_per_round - 1
        [decided] = peer["removals"]["decided"]
        assert decided["client"] == index and decided["evidence_round"] is None
        gone_from = decided["from_step"]
        assert lie_round < gone_from // config.steps_per_round <= silent_round < cut
        log = MessageLog(directory / "state" / "messages.log").messages(0)
        assert {m.step for m in log if m.origin == index} == set(range(gone_from))
