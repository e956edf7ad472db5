"""Peak memory of resuming a full-parameter gossip run, against building it afresh.

A 16-client full-parameter ChocoSGD run holds 17 GB of models (x and x̂ per client); a resume
that reads the checkpoint whole beside the fresh build would need about 34 GB, more than this
24 GB machine has. Each phase runs in its own process, which this one watches: the figure is its
peak anonymous memory (RssAnon, sampled every few milliseconds), since the pages of a
memory-mapped checkpoint are the file's and the kernel drops them under pressure, while
ru_maxrss would count them. Medians of --repeats processes.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/resume_memory.py [--clients 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.sim.checkpoint import CHECKPOINT_NAME, Progress, load_checkpoint, save_checkpoint
from seedflood.sim.devices import proc_status_kb
from seedflood.sim.runner import build

PHASES = ("save", "build", "resume")
SAMPLE_SECONDS = 0.005


def config_for(clients: int) -> RunConfig:
    return RunConfig(method="choco", clients=clients, lr=0.005, n_val=16, n_test=16)


def phase(name: str, clients: int, directory: Path) -> float:
    """Run one phase in this process; the size of the models it holds, in GB."""
    config = config_for(clients)
    algorithm = build(config).algorithm
    path = directory / CHECKPOINT_NAME
    if name == "save":
        save_checkpoint(path, config, Progress(0, [], 0.0, 0.0, 0.0), algorithm)
    elif name == "resume":
        load_checkpoint(path, config, algorithm)
    return (algorithm.x.nbytes + algorithm.x_hat.nbytes) / 2**30  # type: ignore[attr-defined]


def in_child(name: str, clients: int, directory: Path) -> tuple[float, float]:
    """(peak anonymous memory, models) in GB of one phase run in a child process."""
    command = [sys.executable, __file__, "--phase", name, "--clients", str(clients)]
    child = subprocess.Popen([*command, "--dir", str(directory)], stdout=subprocess.PIPE, text=True)
    peak_kb = 0
    while child.poll() is None:
        peak_kb = max(peak_kb, proc_status_kb("RssAnon", child.pid) or 0)
        time.sleep(SAMPLE_SECONDS)
    stdout, _ = child.communicate()
    if child.returncode:
        raise RuntimeError(f"phase {name} failed with status {child.returncode}")
    return peak_kb / 2**20, float(stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    if args.phase:
        print(phase(args.phase, args.clients, args.dir))
        return
    with tempfile.TemporaryDirectory() as directory:
        _, models_gb = in_child("save", args.clients, Path(directory))
        peaks = {
            name: statistics.median(
                in_child(name, args.clients, Path(directory))[0] for _ in range(args.repeats)
            )
            for name in ("build", "resume")
        }
    extra = peaks["resume"] - peaks["build"]
    print(
        f"ChocoSGD, {args.clients} clients, SmolLM2-135M: models {models_gb:.2f} GB; peak "
        f"anonymous memory {peaks['build']:.2f} GB building, {peaks['resume']:.2f} GB resuming "
        f"(+{extra:.2f} GB, {extra / models_gb:.2f}x the models)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        args.out / "resume_memory.json",
        {
            "method": "choco",
            "clients": args.clients,
            "models_gb": models_gb,
            "peak_anonymous_build_gb": peaks["build"],
            "peak_anonymous_resume_gb": peaks["resume"],
            "resume_extra_over_models": extra / models_gb,
            "repeats": args.repeats,
        },
    )


if __name__ == "__main__":
    main()
