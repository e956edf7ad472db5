"""How SeedFlood's simulator scales with clients: time per round, time outside forwards, memory.

For each client count and each flooding budget (hops = 1 and hops = diameter) a fresh process
builds the run (SmolLM2-135M, SST-2, ring, SubCGE, batched forwards) and times --rounds rounds.
With hops = 1 a message needs diameter rounds to reach everyone, so the messages in flight (and
the memory and work they cost) only reach their steady state after that many rounds. Those
rounds are *filled* first: they flood and commit real messages whose scalars are drawn at random
instead of computed by forward passes. Time inside the model's forward passes is measured by
wrapping the backbone's forward (correction terms of batched forwards included), so "outside" is
everything else: batch assembly, walking the shared weights, flooding, commits. Peak RSS is the
child process's own.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scale.py [--clients 16 64 128] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from seedflood.files import atomic_write_json
from seedflood.sim.devices import peak_rss_mb


def measure(clients: int, hops: str, batch: int, rounds: int) -> dict[str, float]:
    """One configuration, in this process."""
    from seedflood.config import RunConfig
    from seedflood.sim.runner import build

    config = RunConfig(
        clients=clients,
        topology="ring",
        batch_size=batch,
        n_train=max(1024, batch * clients),
        n_val=1,
        n_test=1,
        hops=1 if hops == "1" else None,
        batched_forward=True,
        lr=0.01,
    )
    algorithm = build(config).algorithm
    backbone = algorithm.model.base_model
    forward = backbone.forward
    inside = [0.0]

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - started

    backbone.forward = timed
    fill = algorithm.topology.diameter if algorithm.hops < algorithm.topology.diameter else 1
    generator = torch.Generator().manual_seed(0)
    algorithm._estimates_batched = lambda step: [
        (float(g), 0.0) for g in torch.randn(clients, generator=generator)
    ]
    fill_started = time.perf_counter()
    for round_index in range(fill):
        algorithm.run_round(round_index)
    fill_seconds = (time.perf_counter() - fill_started) / fill
    del algorithm._estimates_batched
    inside[0] = 0.0
    started = time.perf_counter()
    for round_index in range(fill, fill + rounds):
        algorithm.run_round(round_index)
    seconds = (time.perf_counter() - started) / rounds
    return {
        "clients": clients,
        "hops": algorithm.hops,
        "batch": batch,
        "seconds_per_round": seconds,
        "seconds_per_client_step": seconds / clients,
        "outside_forward_share": 1 - inside[0] / rounds / seconds,
        "filled_rounds": fill,
        "seconds_per_filled_round": fill_seconds,
        "held_pending_messages": algorithm.pending_held(),
        "peak_rss_mb": peak_rss_mb(),
    }


def plot(rows: list[dict[str, float]], directory: Path) -> None:
    """Time per client-step and peak memory against clients, one line per flooding budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    charts = (
        ("scale_time.png", "seconds_per_client_step", "seconds per client-step"),
        ("scale_memory.png", "peak_rss_mb", "peak RSS (MB)"),
    )
    for filename, key, label in charts:
        figure, axes = plt.subplots(figsize=(5.5, 3.8))
        for name, diameter in (("hops = 1", False), ("hops = diameter", True)):
            points = sorted((r["clients"], r[key]) for r in rows if (r["hops"] > 1) == diameter)
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", label=name)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("clients (ring, SmolLM2-135M, SST-2)")
        axes.set_ylabel(label)
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(directory / filename, dpi=120)
        plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64, 128, 256, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("CLIENTS", "HOPS"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    parser.add_argument("--plots", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(int(args.one[0]), args.one[1], args.batch, args.rounds)))
        return
    path = args.out / "scale.json"
    # Rows of earlier invocations (other client counts) are kept; a rerun replaces its own.
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    header = ("clients", 7), ("hops", 5), ("s/round", 8), ("s/step", 8), ("outside", 8), ("MB", 7)
    print(" ".join(f"{name:>{width}}" for name, width in header))
    for clients in args.clients:
        for hops in ("1", "diameter"):
            command = [sys.executable, __file__, "--one", str(clients), hops]
            command += ["--batch", str(args.batch), "--rounds", str(args.rounds)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            row = json.loads(output.strip().splitlines()[-1])
            rows = [r for r in rows if (r["clients"], r["hops"]) != (row["clients"], row["hops"])]
            rows.append(row)
            print(
                f"{row['clients']:>7} {row['hops']:>5} {row['seconds_per_round']:>8.1f} "
                f"{row['seconds_per_client_step']:>8.3f} {row['outside_forward_share']:>8.1%} "
                f"{row['peak_rss_mb']:>7.0f}"
            )
            rows.sort(key=lambda r: (r["clients"], r["hops"]))
            atomic_write_json(path, {"batch": args.batch, "rows": rows})
    plot(rows, args.plots)


if __name__ == "__main__":
    main()
