"""What resuming a DZSGD run from its scalar ledger costs: seconds a replayed round, against the
seconds a trained round takes (its forward passes), on SmolLM2-135M, with LoRA or (--full) on
every parameter.

A replayed round draws every client's direction from its seed, adds it scaled by the logged
scalar, and mixes; no forward pass, so its cost is the draws': one a client and local step. The
scalars here are random (a replay's cost does not depend on their values). One local step a
round, as configs/paper/scaling-sst2-long.yaml's DZSGD-LoRA takes; median of --rounds rounds at
each client count, on --threads threads (one by default).

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scalar_replay.py [--clients 16 32 128]
    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scalar_replay.py --full --clients 16 \
        --rounds 5 --threads 2   # the tuning grid's full DZSGD: 8.6 GB of client models
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.sim.runner import build


def replay_seconds(clients: int, rounds: int, local_steps: int, lora: bool) -> list[float]:
    config = RunConfig(
        method="dzsgd", lora=lora, clients=clients, local_steps=local_steps, n_val=16, n_test=16
    )
    algorithm = build(config).algorithm
    draw = random.Random(0)
    seconds = []
    for round_index in range(rounds):
        scalars = [draw.gauss(0.0, 1.0) for _ in range(clients * config.steps_per_round)]
        started = time.perf_counter()
        algorithm.replay_round(round_index, scalars)  # type: ignore[attr-defined]
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--full", action="store_true", help="every parameter, not LoRA")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    method = "dzsgd" if args.full else "dzsgd-lora"
    figures = []
    for clients in args.clients:
        seconds = replay_seconds(clients, args.rounds, args.local_steps, lora=not args.full)
        median = statistics.median(seconds)
        per_draw = median / (clients * args.local_steps)
        figures.append(
            {
                "clients": clients,
                "local_steps": args.local_steps,
                "median_s_per_round": median,
                "median_s_per_client_step": per_draw,
                "seconds": seconds,
            }
        )
        print(
            f"{method}, {clients} clients, {args.local_steps} local step(s): {median:.3f} s a "
            f"replayed round ({1000 * per_draw:.1f} ms a client-step; median of {args.rounds}); "
            f"300 rounds replay in {300 * median:.0f} s"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    name = "scalar_replay_full.json" if args.full else "scalar_replay.json"
    atomic_write_json(
        args.out / name,
        {
            "method": method,
            "model": "SmolLM2-135M-Instruct",
            "threads": args.threads,
            "runs": figures,
        },
    )


if __name__ == "__main__":
    main()
