"""Where the divergence guard's limits come from: per-step mean |scalar| of stable, drifting and
diverging runs, read from their ledgers.

For each run the script reports the largest *spike* ratio (a step's mean |scalar| over the median
of the ``--window`` steps before) and the largest *drift* ratio (the median of the last
``--drift-window`` steps over the lowest such median before), the first step over each candidate
limit, and the step where the default guard would have stopped the run with the validation
accuracy recorded there. A limit must never stop the stable runs and must stop the diverging and
drifting ones before their accuracy falls far.

Runs come from two places: ``--lrs`` trains the quickstart on ``--model`` once per rate with the
guard off; ``--ledgers`` reads run folders already made (a SmolLM2 run takes hours on a CPU),
SeedFlood's by their message logs and DZSGD's by their scalar ledgers:

    .venv/bin/python benchmarks/guard_rule.py --model tiny --rounds 300
    .venv/bin/python benchmarks/guard_rule.py --lrs '' \
        --ledgers results/long-sst2-lr0.01 results/long-sst2 --out results/bench/guard_rule_smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import deque
from pathlib import Path
from typing import Any

from seedflood.config import RunConfig, load_config
from seedflood.files import atomic_write_json
from seedflood.protocol.guard import DivergenceGuard
from seedflood.protocol.ledger import LOG
from seedflood.protocol.messages import Message
from seedflood.report import step_means
from seedflood.sim.runner import run
from seedflood.sim.scalar_ledger import step_means as scalar_means

SPIKE_LIMITS = (3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
DRIFT_LIMITS = (1.25, 1.5, 1.75, 2.0)


def spike_ratios(means: list[float], window: int, warmup: int) -> list[float]:
    """mean_t / median(the previous ``window`` means), from the ``warmup``-th step on."""
    previous: deque[float] = deque(maxlen=window)
    out = []
    for mean in means:
        out.append(mean / statistics.median(previous) if len(previous) >= warmup else 0.0)
        previous.append(mean)
    return out


def drift_ratios(means: list[float], window: int, warmup: int) -> list[float]:
    """median(the last ``window`` means) / the lowest such median before, once one is known."""
    out, lowest = [], None
    for t in range(len(means)):
        if t + 1 < warmup + window:
            out.append(0.0)
            continue
        median = statistics.median(means[t + 1 - window : t + 1])
        out.append(median / lowest if lowest else 0.0)
        lowest = median if lowest is None else min(lowest, median)
    return out


def default_guard_stop(means: list[float]) -> tuple[int, str] | None:
    """The step and rule at which the default guard (RunConfig's defaults) stops the run."""
    guard = DivergenceGuard.from_config(RunConfig())
    assert guard is not None
    for step, mean in enumerate(means):
        if tripped := guard.check(step, [Message(step, 0, mean)]):
            return tripped.step, tripped.rule
    return None


def first_over(ratios: list[float], limits: tuple[float, ...]) -> dict[str, int | None]:
    return {f"{k:g}": next((t for t, r in enumerate(ratios) if r > k), None) for k in limits}


def analyse(run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A SeedFlood run's committed steps from its message log, or a DZSGD run's from its scalar
    ledger (``scalars.jsonl``, kept while it runs and committed between sessions)."""
    means = step_means(run_dir / LOG) if (run_dir / LOG).exists() else scalar_means(run_dir)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    spikes = spike_ratios(means, args.window, args.warmup)
    drifts = drift_ratios(means, args.drift_window, args.warmup)
    stop = default_guard_stop(means)
    accuracy = {h["round"]: h["accuracy"] for h in history if "accuracy" in h}
    before_stop = [a for r, a in accuracy.items() if stop is None or r <= stop[0]]
    return {
        "run": str(run_dir),
        "steps": len(means),
        "accuracy_by_round": accuracy,
        "best_accuracy": max(accuracy.values()),
        "last_accuracy_before_stop": before_stop[-1] if before_stop else None,
        "final_train_loss": history[-1].get("train_loss"),
        "max_spike_ratio": max(spikes),
        "max_drift_ratio": max(drifts),
        "first_step_over_spike": first_over(spikes, SPIKE_LIMITS),
        "first_step_over_drift": first_over(drifts, DRIFT_LIMITS),
        "default_guard_stop": stop,
        "mean_abs_scalar_first_last": [means[0], means[-1]],
    }


def train(lr: float, args: argparse.Namespace) -> Path:
    overrides = [
        f"model={args.model}",
        f"rounds={args.rounds}",
        f"lr={lr}",
        "guard_factor=null",
        "eval_every=50",
        "eval_examples=64",
        "n_test=200",
        "save_model=false",
    ]
    run_dir = args.out / f"lr-{lr:g}"
    run(load_config(Path("configs/quickstart.yaml"), overrides), run_dir)
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lrs", default="0.01,0.1,1,3,10,30")
    parser.add_argument("--ledgers", type=Path, nargs="*", default=[])
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--drift-window", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("results/bench/guard_rule"))
    args = parser.parse_args()
    run_dirs = [train(float(lr), args) for lr in args.lrs.split(",") if lr] + args.ledgers
    rows = []
    for run_dir in run_dirs:
        rows.append(analyse(run_dir, args))
        print(json.dumps(rows[-1]), flush=True)
    record = {
        "model": args.model,
        "rounds": args.rounds,
        "window": args.window,
        "drift_window": args.drift_window,
        "rows": rows,
    }
    atomic_write_json(args.out / "guard_rule.json", record)
    print(f"wrote {args.out / 'guard_rule.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
