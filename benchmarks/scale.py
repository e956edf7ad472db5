"""How SeedFlood's simulator scales with clients: time per round, time outside forwards, memory.

For each client count and each flooding budget (hops = 1 and hops = diameter) a fresh process
builds the run (SmolLM2-135M, SST-2, ring, SubCGE, batched forwards) and times --rounds rounds
after one warm-up round. Time inside the model's forward passes is measured by wrapping the
backbone's forward, so "outside" is everything else: batch assembly, correction terms, flooding,
commits. Peak RSS is the child process's own.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scale.py [--clients 16 64 128] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from seedflood.metrics import atomic_write_json, peak_rss_mb


def measure(clients: int, hops: str, batch: int, rounds: int) -> dict[str, float]:
    """One configuration, in this process."""
    from seedflood.config import RunConfig
    from seedflood.simulator import build

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
    algorithm.run_round(0)
    inside[0] = 0.0
    started = time.perf_counter()
    for round_index in range(1, rounds + 1):
        algorithm.run_round(round_index)
    seconds = (time.perf_counter() - started) / rounds
    return {
        "clients": clients,
        "hops": algorithm.hops,
        "batch": batch,
        "seconds_per_round": seconds,
        "seconds_per_client_step": seconds / clients,
        "outside_forward_share": 1 - inside[0] / rounds / seconds,
        "pending_messages": float(sum(len(ledger) for ledger in algorithm.ledgers)),
        "peak_rss_mb": peak_rss_mb(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64, 128, 256, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("CLIENTS", "HOPS"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(int(args.one[0]), args.one[1], args.batch, args.rounds)))
        return
    rows = []
    header = ("clients", 7), ("hops", 5), ("s/round", 8), ("s/step", 8), ("outside", 8), ("MB", 7)
    print(" ".join(f"{name:>{width}}" for name, width in header))
    for clients in args.clients:
        for hops in ("1", "diameter"):
            command = [sys.executable, __file__, "--one", str(clients), hops]
            command += ["--batch", str(args.batch), "--rounds", str(args.rounds)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            row = json.loads(output.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"{row['clients']:>7} {row['hops']:>5} {row['seconds_per_round']:>8.1f} "
                f"{row['seconds_per_client_step']:>8.3f} {row['outside_forward_share']:>8.1%} "
                f"{row['peak_rss_mb']:>7.0f}"
            )
            atomic_write_json(args.out / "scale.json", {"batch": args.batch, "rows": rows})


if __name__ == "__main__":
    main()
