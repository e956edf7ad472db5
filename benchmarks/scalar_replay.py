"""What resuming a DZSGD run from its scalar ledger costs: seconds a replayed round, against the
seconds a trained round takes (its forward passes), on SmolLM2-135M, with LoRA or (--full) on
every parameter.

A replayed round draws every client's direction from its seed, adds it scaled by the logged
scalar, and mixes; no forward pass, so its cost is the draws': one a client and local step. The
scalars here are random (a replay's cost does not depend on their values). One local step a
round, as configs/paper/scaling-sst2-long.yaml's DZSGD-LoRA takes; median of --rounds rounds at
each client count, on --threads threads (one by default). --draw-threads times each given number
of threads drawing full DZSGD's directions ahead ($SEEDFLOOD_DRAW_THREADS, seedflood.zo.ahead),
alternating between them round by round; --train times trained rounds (forwards included) instead.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scalar_replay.py [--clients 16 32 128]
    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scalar_replay.py --full --clients 16 \
        --rounds 5 --threads 2   # the tuning grid's full DZSGD: 8.6 GB of client models
    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scalar_replay.py --full --clients 4 \
        --rounds 3 --threads 2 --draw-threads 0 1 [--train]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

import torch

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.sim.devices import DRAW_THREADS_VARIABLE
from seedflood.sim.runner import build


def round_seconds(
    clients: int, rounds: int, local_steps: int, lora: bool, draw_threads: list[int], train: bool
) -> dict[int, list[float]]:
    """Seconds of each round, by the number of draw threads it ran with: one run each, their
    rounds taken in turn so that a slow stretch of a shared machine falls on all of them."""
    config = RunConfig(
        method="dzsgd", lora=lora, clients=clients, local_steps=local_steps, n_val=16, n_test=16
    )
    algorithms = {}
    for threads in draw_threads:
        os.environ[DRAW_THREADS_VARIABLE] = str(threads)
        algorithms[threads] = build(config).algorithm
    draw = random.Random(0)
    seconds: dict[int, list[float]] = {threads: [] for threads in draw_threads}
    for round_index in range(rounds):
        scalars = [draw.gauss(0.0, 1.0) for _ in range(clients * config.steps_per_round)]
        for threads, algorithm in algorithms.items():
            started = time.perf_counter()
            if train:
                algorithm.run_round(round_index)
            else:
                algorithm.replay_round(round_index, scalars)  # type: ignore[attr-defined]
            seconds[threads].append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--full", action="store_true", help="every parameter, not LoRA")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draw-threads", type=int, nargs="+", default=[0])
    parser.add_argument("--train", action="store_true", help="time trained rounds, not replays")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    method = "dzsgd" if args.full else "dzsgd-lora"
    figures = []
    what = "trained" if args.train else "replayed"
    for clients in args.clients:
        by_threads = round_seconds(
            clients, args.rounds, args.local_steps, not args.full, args.draw_threads, args.train
        )
        for draw_threads, seconds in by_threads.items():
            median = statistics.median(seconds)
            per_draw = median / (clients * args.local_steps)
            figures.append(
                {
                    "clients": clients,
                    "local_steps": args.local_steps,
                    "draw_threads": draw_threads,
                    "median_s_per_round": median,
                    "median_s_per_client_step": per_draw,
                    "seconds": seconds,
                }
            )
            print(
                f"{method}, {clients} clients, {args.local_steps} local step(s), {draw_threads} "
                f"draw thread(s): {median:.3f} s a {what} round ({1000 * per_draw:.1f} ms a "
                f"client-step; median of {args.rounds})"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    name = "scalar_replay_full.json" if args.full else "scalar_replay.json"
    if args.train:
        name = name.replace("scalar_replay", "dzsgd_rounds")
    atomic_write_json(
        args.out / name,
        {
            "method": method,
            "what": f"{what} rounds",
            "model": "SmolLM2-135M-Instruct",
            "threads": args.threads,
            "runs": figures,
        },
    )


if __name__ == "__main__":
    main()
