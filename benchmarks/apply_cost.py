"""Seconds to apply K messages to SmolLM2-135M: dense regeneration vs SubCGE.

Dense (MeZO) application regenerates a d-dimensional Gaussian per message; SubCGE adds one row per
weight matrix (per-message scatter) or accumulates all scalars into A and merges W += A V_eᵀ once
(batched scatter + merge). Dense is measured on a few messages and reported per message, since
1,024 of them take minutes. Medians of --repeats runs; messages of one step from K clients.

    python benchmarks/apply_cost.py [--repeats 5] [--dense-messages 3] [--out results/bench]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from timing import median_seconds

from seedflood.files import atomic_write_json
from seedflood.learning.models import load_model
from seedflood.zo import DenseDirection, SubCGEDirection, message_seed, trainable_matrices

COUNTS = (1, 16, 256, 1024)


def updates(count: int) -> list[tuple[int, int, float]]:
    return [(message_seed(0, origin, 0), 0, 1e-7) for origin in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dense-messages", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    model, _ = load_model("smollm2-135m")
    subcge = SubCGEDirection(trainable_matrices(model), rank=32, refresh=1000, run_seed=0)
    basis_seconds = median_seconds(lambda: subcge.basis(0), 1)
    rows = []
    for count in COUNTS:
        batch = updates(count)
        scatter = median_seconds(lambda b=batch: subcge.apply(b), args.repeats)
        merged = median_seconds(lambda b=batch: subcge.apply_merged(b), args.repeats)
        rows.append({"messages": count, "scatter_seconds": scatter, "merged_seconds": merged})
    dense = DenseDirection(list(model.parameters()))
    dense_batch = updates(args.dense_messages)
    dense_seconds = median_seconds(lambda: dense.apply(dense_batch), max(1, args.repeats // 2))
    dense_per_message = dense_seconds / args.dense_messages
    largest = rows[-1]
    subcge_best = min(largest["scatter_seconds"], largest["merged_seconds"])
    result = {
        "model": "smollm2-135m",
        "parameters": sum(p.numel() for p in model.parameters()),
        "rank": 32,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "basis_seconds": basis_seconds,
        "rows": rows,
        "subcge_seconds_1024": subcge_best,
        "subcge_seconds_per_message": subcge_best / 1024,
        "dense_messages_measured": args.dense_messages,
        "dense_seconds_per_message": dense_per_message,
        "dense_over_subcge_per_message": dense_per_message / (subcge_best / 1024),
    }
    print(
        f"SmolLM2-135M, rank 32, median of {args.repeats} runs, {torch.get_num_threads()} threads"
    )
    print(f"{'messages':>8} {'scatter s':>10} {'merged s':>9}")
    for row in rows:
        print(f"{row['messages']:>8} {row['scatter_seconds']:>10.4f} {row['merged_seconds']:>9.4f}")
    print(f"dense: {dense_per_message:.3f} s per message ({args.dense_messages} measured)")
    print(
        f"SubCGE, 1,024 messages: {subcge_best:.3f} s; dense / SubCGE per message: "
        f"{result['dense_over_subcge_per_message']:,.0f}x"
    )
    atomic_write_json(args.out / "apply_cost.json", result)


if __name__ == "__main__":
    main()
