"""`seedflood launch` interrupted by SIGTERM or SIGINT passes the signal on to its peers, ends
with exit code 2 naming the signal, and leaves no process behind: no peer, no DHT process, no
p2pd daemon; the launcher signals a peer's whole process group, and kills what ignores it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from seedflood.peers.launch import read_status, stop_peers
from tests.peers.test_node import wait_until, write_config


def ended(process: psutil.Process) -> bool:
    """Gone, or a zombie that its new parent has yet to reap: either way it runs no more."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stopping_signals_whole_groups_and_kills_what_ignores_the_signal() -> None:
    """Two stand-in peers, each a shell with a child in its group; one ignores SIGTERM."""
    polite = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    stubborn = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 30 & wait"], start_new_session=True
    )
    shells = [psutil.Process(polite.pid), psutil.Process(stubborn.pid)]
    wait_until(lambda: all(shell.children() for shell in shells), 5, "the shells' children")
    children = [child for shell in shells for child in shell.children()]
    try:
        stop_peers([polite, stubborn], signal.SIGTERM, grace=0.3)
        assert (polite.returncode, stubborn.returncode) == (-signal.SIGTERM, -signal.SIGKILL)
        wait_until(lambda: all(ended(p) for p in children), 2, "the shells' children to end")
    finally:
        for process in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


@pytest.mark.slow  # real `seedflood launch` and `seedflood peer` processes
@pytest.mark.xdist_group("real_peers")
@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_launch_stops_every_peer_and_says_why(
    data_dir, tmp_path: Path, sent: signal.Signals
) -> None:
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=2, rounds=10_000)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "seedflood", "launch", str(config_file), "--out", str(out)]
    launcher = subprocess.Popen(
        [*command, "--pace", "0.25"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    family: list[psutil.Process] = []
    try:
        training = [out / "peers" / str(k) for k in range(2)]
        wait_until(
            lambda: all(read_status(d).get("round", 0) >= 1 for d in training), 240, "round 1"
        )
        peers = psutil.Process(launcher.pid).children()
        family = psutil.Process(launcher.pid).children(recursive=True)
        assert [p.cmdline()[3] for p in peers] == ["peer", "peer"]
        # a peer's group: the peer, its DHT process and its p2pd daemon
        grouped = [p for p in family if os.getpgid(p.pid) in {q.pid for q in peers}]
        assert len(grouped) >= 6 and len([p for p in grouped if p.name() == "p2pd"]) == 2
        launcher.send_signal(sent)
        _, stderr = launcher.communicate(timeout=60)
        said = " ".join(stderr.decode().split())
        assert launcher.returncode == 2, said
        assert f"error: interrupted by {sent.name}; every peer was stopped with it" in said
        assert "Traceback" not in said
        # the peers' groups ended before the launcher did; torch's shared-memory manager, in a
        # session of its own, ends once its clients are gone
        assert [p for p in grouped if not ended(p)] == []
        _, alive = psutil.wait_procs(family, timeout=10)
        assert [p for p in alive if not ended(p)] == []
        # the peers stopped mid-run: the launcher merged nothing
        assert 1 <= read_status(training[0])["round"] < 10_000
        assert not (out / "results.json").exists()
    finally:  # a failed test leaves nothing running either
        if launcher.poll() is None:
            family = family or psutil.Process(launcher.pid).children(recursive=True)
            launcher.kill()
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
