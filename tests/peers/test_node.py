"""Real peer processes on 127.0.0.1: they end on the simulator's model bit for bit, a peer killed
with SIGKILL restarts from its state dir and loses nothing, and a late joiner catches up by
replay. Each peer is a `seedflood peer` process with its own DHT node and p2pd daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import load_config
from seedflood.peers.crypto import load_or_create_key, public_hex
from seedflood.peers.launch import (
    launch,
    merge_results,
    peer_command,
    peer_threads,
    read_status,
    wait_for_address,
    write_allowlist,
)
from seedflood.peers.p2p import FAULTS_VARIABLE
from seedflood.peers.state import state_hash
from seedflood.protocol.message_log import MessageLog
from seedflood.report import find_runs, summarize
from seedflood.sim.replay import replay
from seedflood.sim.runner import build
from tests.forked import Child, start_forked_peer

pytest.importorskip("hivemind", reason="real-peer tests need hivemind installed")
# real `seedflood peer` processes, marked to run one test at a time (see the Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_peers")]


def write_config(path: Path, data: Path, **overrides) -> Path:
    config = {
        "model": "tiny",
        "task": "sst2",
        "data_dir": str(data),
        "clients": 4,
        "topology": "ring",
        "rounds": 20,
        "rank": 8,
        "batch_size": 4,
        "n_train": 64,
        "n_val": 16,
        "n_test": 40,
        "batched_forward": False,
        "hash_every": 5,
        "snapshot_every": 8,
        **overrides,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def simulated_hash(config_file: Path, threads: int) -> str:
    """The simulator's final model with the peers' thread count (float results depend on it)."""
    config = load_config(config_file, [])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(config.seed)
        experiment = build(config)
        for round_index in range(config.rounds):
            experiment.algorithm.run_round(round_index)
        return state_hash(experiment.algorithm.direction.matrices)
    finally:
        torch.set_num_threads(before)


def test_four_peer_processes_end_on_the_simulators_model(data_dir, tmp_path: Path) -> None:
    config_file = write_config(tmp_path / "run.yaml", data_dir)
    results = launch(config_file, peers=4, out_dir=tmp_path / "out", run_id="four", timeout=300)
    assert results["consensus"] and len(results["peers"]) == 4
    assert results["state_hash"] == simulated_hash(config_file, peer_threads(4))
    # every peer's ledger (its log and manifest) rebuilds the model alone, and its export is it
    for k in range(4):
        state_dir = tmp_path / "out" / "peers" / str(k) / "state"
        assert replay(state_dir)["state_hash"] == results["state_hash"]
        assert (state_dir / "model" / "model.safetensors").is_file()
    assert [p["committed_step"] for p in results["peers"]] == [19] * 4
    assert all(p["divergences"] == 0 for p in results["peers"])
    # every message of every client crossed every one of the ring's 4 edges at least once
    assert results["messages_per_edge_max"] >= 20 * 4 // 2
    assert results["bytes_per_edge_max"] >= 4 * results["messages_per_edge_max"]
    assert 0.0 <= results["accuracy"] <= 1.0 and "zero_shot_accuracy" in results
    # every batch was signed and checked, and honest peers refused none
    assert results["rejected"] == dict.fromkeys(
        ["equivocation", "forged", "not_member", "replayed"], 0
    )
    assert results["signature_bytes"] >= 4 * 20 * 2 * 88  # a base64 signature per batch per edge
    # `seedflood report` reads the launched run like a simulated one, per-peer files aside
    runs = find_runs([tmp_path / "out"])
    assert len(runs) == 1 and runs[0].results["kind"] == "run"
    assert summarize(runs)[0]["bytes_per_edge"] == results["bytes_per_edge_max"]


def test_four_peers_whose_pushes_are_dropped_recover_by_pull_repair(
    data_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = write_config(tmp_path / "run.yaml", data_dir, rounds=12)
    monkeypatch.setenv(FAULTS_VARIABLE, "drop=0.3,seed=7")
    out = tmp_path / "out"
    results = launch(config_file, peers=4, out_dir=out, run_id="lossy", timeout=300)
    assert results["consensus"] and [p["committed_step"] for p in results["peers"]] == [11] * 4
    assert results["state_hash"] == simulated_hash(config_file, peer_threads(4))
    faults = [json.loads((out / "peers" / str(k) / "results.json").read_text()) for k in range(4)]
    dropped = sum(r["link_faults"]["drop"] for r in faults)
    pushes = sum(r["link_faults"]["pushes"] for r in faults)
    assert 0.2 < dropped / pushes < 0.4, (dropped, pushes)
    assert results["repair_bytes"] > 0 and sum(results["rejected"].values()) == 0


def kill_group(process: Child | subprocess.Popen) -> None:
    """SIGKILL the peer with its DHT process and p2pd daemon: a machine that lost power."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


class PacedPeers:
    """Peer processes of one run, started one by one and paced (0.25 s per round unless told),
    so a test can kill, restart or add one mid-run; the first one started is everyone's
    bootstrap. Each is forked from a server that has imported the peer (tests.forked). A test
    that needs the run to last through something slow (a process start, a removal's wait)
    paces it slower rather than running more rounds: the same time, less CPU."""

    def __init__(
        self,
        config_file: Path,
        run_id: str,
        root: Path,
        allowlist: int | None = None,
        patience: float = 0.0,
        pace: float = 0.25,
    ) -> None:
        self.config_file, self.run_id, self.root = config_file, run_id, root
        self.patience, self.pace = patience, pace
        self.processes: dict[int, Child] = {}
        self.address: str | None = None
        self.allow = (
            None
            if allowlist is None
            else write_allowlist(
                root / "allowlist", [self.dir(k) / "state" for k in range(allowlist)]
            )
        )

    def dir(self, k: int) -> Path:
        return self.root / "peers" / str(k)

    def start(self, k: int, environment: dict[str, str] | None = None) -> None:
        command = peer_command(
            self.config_file,
            run_id=self.run_id,
            directory=self.dir(k),
            initial_peers=[self.address] if self.address else [],
            pace=self.pace,
            evaluate=False,
            allow=self.allow,
            patience=self.patience,
        )
        self.processes[k] = start_forked_peer(command, self.dir(k), environment)
        if self.address is None:
            self.address = wait_for_address(self.dir(k), self.processes[k], timeout=120)

    def round(self, k: int) -> int:
        return read_status(self.dir(k)).get("round", 0)

    def kill_at(self, k: int, round_index: int) -> int:
        """SIGKILL peer k once it reached ``round_index``; the round it was at."""
        wait_until(lambda: self.round(k) >= round_index, 180, f"round {round_index}")
        kill_group(self.processes.pop(k))
        return self.round(k)

    def exit_code(self, k: int, timeout: float) -> int:
        """Peer k's exit code once it stops; past ``timeout``, a failure that shows the end of
        every peer's log, so that a hang in CI can be read rather than guessed at."""
        try:
            return self.processes[k].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tails = []
            for j in sorted(self.processes):
                log = self.dir(j) / "peer.log"
                text = log.read_text(errors="replace") if log.is_file() else "(no log)"
                tails.append(f"--- peer {j} ---\n" + "\n".join(text.splitlines()[-60:]))
            raise AssertionError(
                f"peer {k} still runs after {timeout:g} s\n" + "\n".join(tails)
            ) from None

    def finish(self) -> None:
        for k in list(self.processes):
            assert self.exit_code(k, timeout=300) == 0

    def __enter__(self) -> PacedPeers:
        return self

    def __exit__(self, *_) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                kill_group(process)


def test_a_killed_peer_restarts_and_a_late_joiner_catches_up(data_dir, tmp_path: Path) -> None:
    # The joiner starts as soon as the killed peer is back, since starting a process (imports,
    # daemon) takes 5-20 s on a loaded 2-core machine and joining some more: a run of 50
    # rounds paced to 0.5 s (25 s at the least) leaves it time to catch up before the end. The
    # others wait 300 s before removing the killed peer, more than its restart takes on a
    # loaded machine (the default 18 s is not; a peer removed while down stops, as
    # test_liveness shows).
    rounds = 50
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=6, rounds=rounds)
    root = tmp_path / "out"
    with PacedPeers(config_file, "churn", root, patience=300, pace=0.5) as peers:
        for k in range(6):
            peers.start(k)
        killed_at = peers.kill_at(3, 5)
        peers.start(3)
        joiner_started_at = peers.round(0)
        peers.start(6)
        peers.finish()
    dirs = [peers.dir(k) for k in range(7)]
    results = merge_results(root, dirs)
    assert results["consensus"], results["peers"]
    by_client = {p["client"]: p for p in results["peers"]}
    assert sorted(by_client) == list(range(7))
    assert all(
        p["committed_step"] == rounds - 1 and p["divergences"] == 0 for p in by_client.values()
    )
    restarted = json.loads((dirs[3] / "results.json").read_text())
    assert 0 < restarted["replayed"] <= killed_at * 6 and killed_at < rounds
    logs = [MessageLog(d / "state" / "messages.log").messages(0) for d in dirs]
    assert all(log == logs[0] for log in logs)
    # the joiner took part from the step its sponsor's message announced, and not before
    first_step = json.loads((dirs[0] / "state" / "members.json").read_text())["6"]["first_step"]
    print(f"the joiner took part from step {first_step} of {rounds}")
    assert first_step > joiner_started_at > 0
    assert {m.step for m in logs[0] if m.origin == 6} == set(range(first_step, rounds))
    origins_per_step = [sorted(m.origin for m in logs[0] if m.step == t) for t in range(rounds)]
    assert origins_per_step[0] == list(range(6)) and origins_per_step[-1] == list(range(7))
    # the joiner's key reached every member inside its sponsor's signed admission
    joiner_key = public_hex(load_or_create_key(dirs[6] / "state"))
    for d in dirs:
        assert json.loads((d / "state" / "members.json").read_text())["6"]["key"] == joiner_key
    # nothing was refused but the joiner's first pulls, by members that had not yet heard of
    # its admission (a race the design allows: such callers are counted, never banned)
    for peer in results["peers"]:
        assert peer["banned"] == []
        late = peer["rejected"].get("not_member_caller", 0)
        assert sum(peer["rejected"].values()) == late
        assert late == 0 or peer["client"] != 6


def test_a_peer_gone_too_long_is_removed_and_told_so_when_it_returns(
    data_dir, tmp_path: Path
) -> None:
    # Killed, the peer is removed by the others after the default wait (18 s). Restarted with
    # its old state dir, which predates the removal, it pulls, is answered with its signed
    # removal and stops with an error instead of waiting forever on steps it takes no part in.
    # The run is long enough (60 rounds of 1 s at the least) to still be going when the restart
    # pulls.
    rounds = 60
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=4, rounds=rounds)
    with PacedPeers(config_file, "crash", tmp_path / "out", pace=1.0) as peers:
        for k in range(4):
            peers.start(k)
        peers.kill_at(2, 3)
        # a push that reached no one before the kill leaves its step to the removal, so the
        # removal's lower bound is what the survivors had committed, not the round it was at
        committed = max(read_status(peers.dir(k)).get("committed_step", -1) for k in (0, 1, 3))
        dead = json.loads((peers.dir(2) / "state" / "peer.json").read_text())["index"]

        def gone_from(k: int) -> int | None:
            seats = json.loads((peers.dir(k) / "state" / "members.json").read_text())
            return seats[str(dead)]["gone_from"]

        wait_until(lambda: all(gone_from(k) is not None for k in (0, 1, 3)), 180, "the removal")
        peers.start(2)
        assert peers.exit_code(2, timeout=180) == 2  # an error, and why
        del peers.processes[2]
        peers.finish()
    told = " ".join((peers.dir(2) / "peer.log").read_text().split())
    assert f"client {dead} was removed from the run from step {gone_from(0)}: the other" in told
    assert "Start it with a new state dir" in told, told[-2000:]
    survivors = [peers.dir(k) for k in (0, 1, 3)]
    results = merge_results(tmp_path / "out", survivors)
    assert results["consensus"] and all(p["committed_step"] == rounds - 1 for p in results["peers"])
    assert committed < gone_from(0) <= 20
    log = MessageLog(survivors[0] / "state" / "messages.log").messages(0)
    assert {m.step for m in log if m.origin == dead} == set(range(gone_from(0)))
    assert all(len([m for m in log if m.step == t]) == 3 for t in range(gone_from(0), rounds))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--run-id", "a/b"], "run id must be a non-empty name without '/'"),
        (["--run-id", "ok", "--set", "method=dsgd"], "real peers run method seedflood"),
    ],
)
def test_bad_peer_arguments_are_refused_by_name(
    data_dir, tmp_path: Path, arguments: list[str], message: str
) -> None:
    config_file = write_config(tmp_path / "run.yaml", data_dir)
    result = CliRunner().invoke(app, ["peer", str(config_file), *arguments])
    assert result.exit_code == 2 and message in " ".join(result.output.split())
