"""Where the divergence guard's limit comes from: per-step mean |scalar| of stable and diverging
runs, read from their ledgers, against the median of the steps before.

Each run trains with the guard off, then the script replays its ledger step by step and reports,
for the guard's window and warm-up, the largest ratio mean|scalar|_t / median(previous window)
seen while the run was still learning, and the step at which each candidate limit would have
stopped it. A limit must never stop the stable runs and must stop the diverging ones before their
loss explodes.

    .venv/bin/python benchmarks/guard_rule.py --model tiny --rounds 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

from seedflood.config import load_config
from seedflood.files import atomic_write_json
from seedflood.protocol.ledger import LOG
from seedflood.report import step_means
from seedflood.sim.runner import run

LIMITS = (3.0, 4.0, 6.0, 8.0, 12.0, 16.0)


def ratios(means: list[float], window: int, warmup: int) -> list[float]:
    """mean_t / median(the previous ``window`` means), from the ``warmup``-th step on."""
    previous: deque[float] = deque(maxlen=window)
    out = []
    for mean in means:
        out.append(mean / statistics.median(previous) if len(previous) >= warmup else 0.0)
        previous.append(mean)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lrs", default="0.01,0.1,1,5,20")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("results/bench/guard_rule"))
    args = parser.parse_args()
    rows = []
    for lr in [float(x) for x in args.lrs.split(",")]:
        overrides = [
            f"model={args.model}",
            f"rounds={args.rounds}",
            f"lr={lr}",
            "guard_factor=null",
            "eval_every=1000000",
            "eval_examples=64",
            "n_test=200",
            "save_model=false",
        ]
        config = load_config(Path("configs/quickstart.yaml"), overrides)
        run_dir = args.out / f"lr-{lr:g}"
        started = time.perf_counter()
        results = run(config, run_dir)
        history = [
            json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()
        ]
        means = step_means(run_dir / LOG)
        seen = ratios(means, args.window, args.warmup)
        first = {f"{k:g}": next((t for t, r in enumerate(seen) if r > k), None) for k in LIMITS}
        rows.append(
            {
                "lr": lr,
                "accuracy": results["accuracy"],
                "zero_shot": results["zero_shot_accuracy"],
                "final_train_loss": history[-1].get("train_loss"),
                "max_ratio": max(seen),
                "first_step_over": first,
                "mean_abs_scalar_first_last": [means[0], means[-1]],
                "seconds": time.perf_counter() - started,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    record = {"model": args.model, "rounds": args.rounds, "window": args.window, "rows": rows}
    atomic_write_json(args.out / "guard_rule.json", record)
    print(f"wrote {args.out / 'guard_rule.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
