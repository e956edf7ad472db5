"""`seedflood` commands in real child processes that start without importing anything.

A fault that kills a run, or a peer that a test kills, restarts or adds, must be a process of its
own, but a fresh interpreter spends 5-10 CPU-seconds importing torch, transformers and hivemind
before it does anything, and the suite starts about a hundred. A fork server (one per test
worker, free of threads, unlike the worker) imports the command line and the peer once; each
child is forked from it and lives and dies as a fresh one would: its own session, environment
and output file.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import traceback
from pathlib import Path

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(["seedflood.cli", "seedflood.peers.node"])


def _run(args: list[str], environment: dict[str, str], log: str | None) -> None:
    import torch

    from seedflood.cli import app

    os.setsid()  # a group of its own, as `start_new_session`: killpg reaches its DHT and p2pd
    if log is not None:
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
    os.environ.clear()
    os.environ.update(environment)
    if "OMP_NUM_THREADS" in environment:  # read at torch's import, which happened in the server
        torch.set_num_threads(int(environment["OMP_NUM_THREADS"]))
    code = 0
    try:
        app(args, prog_name="seedflood")
    except SystemExit as stop:  # as the interpreter maps it: None is 0, a message is 1
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


class Child:
    """What the tests use of a subprocess.Popen."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"seedflood (pid {self.pid})", timeout or 0.0)
        return self.process.exitcode


def start_seedflood(
    args: list[str], environment: dict[str, str] | None = None, log: Path | None = None
) -> Child:
    """`seedflood ARGS` in a child process, in this process's environment with ``environment``
    added, its output appended to ``log`` (else to this process's)."""
    child = _SERVER.Process(
        target=_run,
        args=(args, {**os.environ, **(environment or {})}, None if log is None else str(log)),
    )
    child.start()
    return Child(child)


def seedflood_in_child(args: list[str], environment: dict[str, str]) -> int:
    """The exit status of `seedflood ARGS` run with one thread in a child process, with
    ``environment`` added: 137 for a run its fault variables killed, as a shell reports a
    SIGKILL."""
    return start_seedflood(args, {"OMP_NUM_THREADS": "1", **environment}).wait()


def start_forked_peer(
    command: list[str], directory: Path, environment: dict[str, str] | None = None
) -> Child:
    """seedflood.peers.launch.start_peer's peer, forked: ``command`` is the one peer_command
    makes (`python -m seedflood peer ...`)."""
    assert command[1:3] == ["-m", "seedflood"], command
    directory.mkdir(parents=True, exist_ok=True)
    return start_seedflood(command[3:], environment, directory / "peer.log")
