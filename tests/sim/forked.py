"""`seedflood` commands in real child processes that start without importing anything.

A fault that kills a run must kill a process, but a fresh interpreter spends 5-10 CPU-seconds
importing torch and transformers before the run's first round, and the suite kills a few dozen
runs. A fork server (one per test worker, multi-thread free, unlike the worker itself) imports
the command line once; each child is forked from it and dies exactly as a fresh one would.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(["seedflood.cli"])


def _run(args: list[str], environment: dict[str, str]) -> None:
    import torch

    from seedflood.cli import app

    os.environ.clear()
    os.environ.update(environment)
    torch.set_num_threads(1)  # as the runs it is compared with, and as OMP_NUM_THREADS=1 would
    try:
        app(args)
    except SystemExit as stop:
        os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def seedflood_in_child(args: list[str], environment: dict[str, str]) -> int:
    """The exit status of `seedflood ARGS` run with one thread in a child process, in this
    process's environment with ``environment`` added: 137 for a run its fault variables killed,
    as a shell reports a SIGKILL."""
    child = _SERVER.Process(target=_run, args=(args, {**os.environ, **environment}))
    child.start()
    child.join()
    assert child.exitcode is not None
    return child.exitcode
