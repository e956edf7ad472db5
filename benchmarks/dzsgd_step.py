"""Seconds per full-parameter DZSGD local step on SmolLM2-135M, and a hash of the rows after.

A DZSGD step draws a 135M-value Gaussian, scores x ± εu and writes x − ηgu: a few passes over
model-sized memory besides two small forwards. The hash lets a faster implementation show that
it takes the same steps bit for bit. Median of --repeats steps of 2 clients on SST-2 batches.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/dzsgd_step.py [--repeats 6]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
from pathlib import Path

from timing import median_seconds

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.sim.runner import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    config = RunConfig(method="dzsgd", clients=2, lr=1e-5, batch_size=8, n_val=16, n_test=16)
    gossip = build(config).algorithm
    steps = itertools.count()

    def one_step() -> None:
        step = next(steps)
        gossip.local_step(step % 2, step)  # type: ignore[attr-defined]

    seconds = median_seconds(one_step, args.repeats)
    digest = hashlib.sha256(gossip.x.numpy().tobytes()).hexdigest()  # type: ignore[attr-defined]
    print(f"median seconds per DZSGD step: {seconds:.2f}; rows after the steps: {digest[:16]}")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        args.out / "dzsgd_step.json",
        {"median_seconds": seconds, "steps": args.repeats, "rows_sha256": digest},
    )


if __name__ == "__main__":
    main()
