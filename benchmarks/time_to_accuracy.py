"""Wall seconds a run took to reach a validation accuracy, read from its history.

A long SmolLM2 run takes hours on a CPU, so this reads runs already made (their `history.jsonl`
and `results.json`) rather than training: for each run, the first evaluation at or above
``--target``, the training seconds recorded there, and the seconds a step took. Training seconds
are what the runner counts (evaluations excluded); a run that shared its machine shows it in
the spread of its per-interval step times, so the report gives the median and the fastest
interval as well, and an estimate of the time to the target at the median pace.

    .venv/bin/python benchmarks/time_to_accuracy.py results/long-sst2 --target 0.8
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from seedflood.files import atomic_write_json, read_jsonl


def time_to_accuracy(run_dir: Path, target: float) -> dict[str, Any]:
    """When ``run_dir``'s validation accuracy first reached ``target``, in steps and seconds."""
    history = [r for r in read_jsonl(run_dir / "history.jsonl") if "train_seconds" in r]
    results = json.loads((run_dir / "results.json").read_text())
    config = results["config"]
    local_steps = config.get("local_steps") or 1
    paces = [
        (b["train_seconds"] - a["train_seconds"]) / ((b["round"] - a["round"]) * local_steps)
        for a, b in itertools.pairwise(history)
        if b["round"] > a["round"]
    ]
    reached = next((r for r in history if r.get("accuracy", 0.0) >= target), None)
    median = statistics.median(paces) if paces else None
    record: dict[str, Any] = {
        "run": str(run_dir),
        "target": target,
        "device": results.get("device"),
        "clients": results.get("clients"),
        "method": results.get("method"),
        "dtype": config.get("dtype", "fp32"),
        "best_accuracy": max(r.get("accuracy", 0.0) for r in history),
        "seconds_per_step_median": median,
        "seconds_per_step_fastest": min(paces) if paces else None,
        "test_accuracy": results.get("accuracy"),
    }
    if reached is None:
        return {**record, "reached": False}
    steps = reached["round"] * local_steps
    return {
        **record,
        "reached": True,
        "step": steps,
        "train_seconds": reached["train_seconds"],
        "train_seconds_at_median_pace": median * steps if median is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run folders (history.jsonl, results.json)"
    )
    parser.add_argument("--target", type=float, default=0.8, help="validation accuracy, 0-1")
    parser.add_argument("--out", type=Path, default=Path("results/bench/time_to_accuracy"))
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "results.json").is_file()]
    if missing:
        print(f"no finished run (results.json) in: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = [time_to_accuracy(run, args.target) for run in args.runs]
    for row in rows:
        print(json.dumps(row))
    atomic_write_json(args.out / "time_to_accuracy.json", {"target": args.target, "runs": rows})
    print(f"wrote {args.out / 'time_to_accuracy.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
