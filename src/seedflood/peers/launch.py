"""`seedflood launch`: N real peers as local processes, the way users try a run on one machine.

Each peer is a `seedflood peer` process in its own session, with its state and results under
``OUT/peers/<k>/``. Peer 0 starts first and the others bootstrap from the address it writes. When
all have finished, their results are merged into ``OUT/results.json``, which `seedflood report`
reads like a simulated run's: traffic per edge is the sum of what each peer counted on its sending
side. A peer's session is its process group (the peer, its DHT process and its p2pd daemon): the
launcher signals whole groups, and when it is interrupted (SIGINT, SIGTERM) or gives up, it
passes the signal on, waits a little and kills what is left, so no peer outlives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from seedflood.files import atomic_write_json, atomic_write_jsonl, atomic_write_text, read_jsonl
from seedflood.peers.crypto import load_or_create_key, public_hex
from seedflood.protocol.traffic import EdgeTraffic, edge_summary

GRACE_SECONDS = 10.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class LaunchError(RuntimeError):
    """A peer process that did not start or did not finish."""


class Interrupted(LaunchError):
    """The launcher was told to stop; by the time this is reported its peers are stopped."""

    def __init__(self, received: signal.Signals) -> None:
        super().__init__(f"interrupted by {received.name}; every peer was stopped with it")


class Interruption:
    """The first SIGINT or SIGTERM the launcher receives, noted by its handler rather than raised
    from it: the loops that wait for the peers raise it at their next poll, so a signal cannot
    land between starting a peer and counting it, and no peer escapes being stopped."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    def note(self, signum: int, _frame: object) -> None:
        self.received = self.received or signal.Signals(signum)

    def check(self) -> None:
        if self.received is not None:
            raise Interrupted(self.received)

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Note SIGINT and SIGTERM while the block runs. Only the main thread may handle signals;
        a launch run from another thread leaves them to its program."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.note) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def peer_command(
    config_file: Path,
    *,
    run_id: str,
    directory: Path,
    overrides: Sequence[str] = (),
    initial_peers: Sequence[str] = (),
    pace: float = 0.0,
    evaluate: bool = True,
    allow: Path | None = None,
    patience: float = 0.0,
) -> list[str]:
    command = [sys.executable, "-m", "seedflood", "peer", str(config_file), "--run-id", run_id]
    command += ["--state-dir", str(directory / "state"), "--out", str(directory)]
    if allow is not None:
        command += ["--allow", str(allow)]
    for override in overrides:
        command += ["--set", override]
    for address in initial_peers:
        command += ["--initial-peers", address]
    if pace:
        command += ["--pace", str(pace)]
    if not evaluate:
        command.append("--no-evaluate")
    if patience:
        command += ["--patience", str(patience)]
    return command


def write_allowlist(path: Path, state_dirs: Sequence[Path]) -> Path:
    """The run's allowlist: the keys of the peers launched here (made now, or kept from a run
    being restarted), so that no other key can take a seat."""
    keys = [public_hex(load_or_create_key(state_dir)) for state_dir in state_dirs]
    atomic_write_text(path, "".join(f"{key}  # peer {k}\n" for k, key in enumerate(keys)))
    return path


def peer_threads(peers: int) -> int:
    """Compute threads per peer when ``peers`` share this machine: oversubscribed OpenMP threads
    spin against each other (4 peers of SmolLM2 on 2 cores ran 7x slower with 2 threads each)."""
    return max(1, (os.cpu_count() or 1) // peers)


def start_peer(
    command: list[str],
    directory: Path,
    threads: int | None = None,
    environment: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a peer in a new session, its output appended to ``directory/peer.log``; ``threads``
    caps its compute threads, so peers sharing a machine do not fight over the cores, and
    ``environment`` adds to this process's (tests inject faults through it)."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(environment or {})}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    with (directory / "peer.log").open("ab") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the peer's whole session: killed alone, it would leave its DHT process and its p2pd
    daemon running."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(process.pid, signum)


def stop_peers(
    processes: Sequence[subprocess.Popen[bytes]], signum: int, grace: float = GRACE_SECONDS
) -> None:
    """Pass ``signum`` to every running peer, give them ``grace`` seconds to end (a peer stopped
    by SIGINT shuts its link and DHT down), then kill whatever is left of their groups."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        signal_group(process, signum)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in running:
        signal_group(process, signal.SIGKILL)
        process.wait()


def wait_for_address(
    directory: Path,
    process: subprocess.Popen[bytes],
    timeout: float,
    check: Callable[[], None] = lambda: None,
) -> str:
    """The first multiaddr a starting peer writes into its state dir; ``check`` runs at every
    poll (the launcher's raises once it is interrupted)."""
    path = directory / "state" / "address"
    deadline = time.monotonic() + timeout
    while not path.is_file():
        check()
        if process.poll() is not None or time.monotonic() > deadline:
            raise LaunchError(
                f"peer in {directory} wrote no address (exit code {process.poll()}); "
                f"see {directory / 'peer.log'}"
            )
        time.sleep(0.2)
    return path.read_text().split()[0]


def read_status(directory: Path) -> dict[str, Any]:
    path = directory / "status.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def rejected_total(counts: Sequence[dict[str, int]]) -> dict[str, int]:
    """Batches the peers refused, by reason, summed: one forged batch pushed to three peers
    counts three times, once per door it was stopped at."""
    total: dict[str, int] = {}
    for count in counts:
        for reason, n in count.items():
            total[reason] = total.get(reason, 0) + n
    return dict(sorted(total.items()))


def merge_results(out_dir: Path, directories: Sequence[Path]) -> dict[str, Any]:
    """One run's results from its peers' results: the evaluating peer's figures, every peer's
    state hash, the traffic of all edges, and the batches every door refused."""
    peers = []
    for directory in directories:
        path = directory / "results.json"
        if not path.is_file():
            raise LaunchError(f"no results from the peer in {directory}; see its peer.log")
        peers.append((directory, json.loads(path.read_text())))
    evaluated = [(d, r) for d, r in peers if "accuracy" in r]
    lead_dir, lead = evaluated[0] if evaluated else peers[0]
    edges: dict[tuple[int, int], EdgeTraffic] = {}
    for _, result in peers:
        for sender, receiver, size, messages, packets, header in result["edges"]:
            edge = edges.setdefault((sender, receiver), EdgeTraffic())
            edge.bytes += size
            edge.messages += messages
            edge.packets += packets
            edge.header_bytes += header
    hashes = {r["state_hash"] for _, r in peers}
    merged = {
        **{k: v for k, v in lead.items() if k not in {"kind", "client", "peer_id", "edges"}},
        "kind": "run",
        "peers": [
            {
                "client": r["client"],
                "state_hash": r["state_hash"],
                "committed_step": r["committed_step"],
                "replayed": r["replayed"],
                "divergences": len(r["divergences"]),
                "rejected": r.get("rejected", {}),
                "banned": sorted(r.get("banned", {})),
                "longest_stall_seconds": r["longest_stall_seconds"],
                "removals": r["removals"],
            }
            for _, r in sorted(peers, key=lambda p: p[1]["client"])
        ],
        "consensus": len(hashes) == 1,
        **edge_summary(edges),
        "repair_bytes": sum(r["repair_bytes_sent"] for _, r in peers),
        "signature_bytes": sum(r.get("signature_bytes_sent", 0) for _, r in peers),
        "rejected": rejected_total([r.get("rejected", {}) for _, r in peers]),
        "wall_seconds": max(r["wall_seconds"] for _, r in peers),
    }
    atomic_write_json(out_dir / "results.json", merged)
    history = lead_dir / "history.jsonl"
    atomic_write_jsonl(out_dir / "history.jsonl", read_jsonl(history) if history.is_file() else [])
    return merged


def launch(
    config_file: Path,
    *,
    peers: int,
    out_dir: Path,
    run_id: str,
    overrides: Sequence[str] = (),
    pace: float = 0.0,
    show: Callable[[list[dict[str, Any]]], None] | None = None,
    timeout: float = 24 * 3600.0,
) -> dict[str, Any]:
    """Run ``peers`` peers to the end and merge their results; peer 0 evaluates the model."""
    if peers < 1:
        raise LaunchError(f"--peers must be at least 1; got {peers}")
    directories = [out_dir / "peers" / str(k) for k in range(peers)]
    allow = write_allowlist(out_dir / "allowlist", [d / "state" for d in directories])

    def command(k: int, initial: Sequence[str]) -> list[str]:
        return peer_command(
            config_file,
            run_id=run_id,
            directory=directories[k],
            overrides=overrides,
            initial_peers=initial,
            pace=pace,
            evaluate=k == 0,
            allow=allow,
        )

    threads = peer_threads(peers)
    processes: list[subprocess.Popen[bytes]] = []
    interruption = Interruption()
    with interruption.handling():
        try:
            processes.append(start_peer(command(0, []), directories[0], threads))
            address = wait_for_address(
                directories[0], processes[0], timeout=300, check=interruption.check
            )
            for k in range(1, peers):
                interruption.check()
                processes.append(start_peer(command(k, [address]), directories[k], threads))
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in processes):
                interruption.check()
                if time.monotonic() > deadline:
                    raise LaunchError(f"the peers did not finish within {timeout:g} s")
                if show:
                    show([read_status(d) for d in directories])
                time.sleep(0.5)
        finally:
            stop_peers(processes, interruption.received or signal.SIGTERM)
    failed = [k for k, p in enumerate(processes) if p.returncode != 0]
    if failed:
        raise LaunchError(
            f"peer(s) {failed} exited with an error; see "
            + ", ".join(str(directories[k] / "peer.log") for k in failed)
        )
    return merge_results(out_dir, directories)
