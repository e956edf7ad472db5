"""Every method on a GPU against the same run on the CPU: same losses to rounding, and the time.

A run on another device is the same experiment (seedflood.sim.devices): its draws are the CPU's, and
only the order of floating-point sums differs. This runs each method for a few rounds on the
tiny model and synthetic SST-2, once per device, and prints the largest difference in training
loss and the final accuracies; a difference above --tolerance fails the check.

    SEEDFLOOD_DATA_DIR= python benchmarks/device_check.py --device cuda [--out results/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.learning.synthetic import write_synthetic_sst2
from seedflood.report import markdown_table
from seedflood.sim.devices import DEVICE_VARIABLE
from seedflood.sim.runner import run

METHODS: dict[str, dict[str, Any]] = {
    "seedflood": {"method": "seedflood"},
    "seedflood-one-by-one": {"method": "seedflood", "batched_forward": False},
    "dsgd": {"method": "dsgd", "lr": 0.05},
    "dsgd-lora": {"method": "dsgd", "lora": True, "lr": 0.2},
    "choco": {"method": "choco", "lr": 0.05},
    "choco-lora": {"method": "choco", "lora": True, "lr": 0.2},
    "dzsgd": {"method": "dzsgd", "lr": 1e-4},
    "dzsgd-lora": {"method": "dzsgd", "lora": True, "lr": 0.05},
}

KEPT = ("accuracy", "wall_seconds", "device", "peak_device_mb")


def run_on(device: str, config: RunConfig, out: Path) -> dict[str, Any]:
    os.environ[DEVICE_VARIABLE] = device
    results = run(config, out)
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    results["train_losses"] = [entry["train_loss"] for entry in history if "train_loss" in entry]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=1e-2)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    rows, records, worst = [], [], 0.0
    with tempfile.TemporaryDirectory() as scratch:
        data = write_synthetic_sst2(Path(scratch) / "data", train=64, validation=40)
        for name, overrides in METHODS.items():
            config = RunConfig(
                **{
                    "model": "tiny",
                    "data_dir": str(data),
                    "clients": 4,
                    "batch_size": 4,
                    "rounds": args.rounds,
                    "eval_every": args.rounds,
                    "n_train": 48,
                    "n_val": 16,
                    "n_test": 40,
                    "lr": 0.01,
                    **overrides,
                }
            )
            cpu = run_on("cpu", config, Path(scratch) / name / "cpu")
            other = run_on(args.device, config, Path(scratch) / name / "device")
            gap = max(
                abs(a - b) for a, b in zip(cpu["train_losses"], other["train_losses"], strict=True)
            )
            worst = max(worst, gap)
            records.append(
                {
                    "method": name,
                    "train_loss_gap": gap,
                    "cpu": {k: cpu[k] for k in KEPT},
                    "device": {k: other[k] for k in KEPT},
                }
            )
            rows.append(
                [
                    name,
                    f"{gap:.2e}",
                    f"{cpu['accuracy']:.3f} / {other['accuracy']:.3f}",
                    f"{cpu['wall_seconds']:.1f} / {other['wall_seconds']:.1f}",
                ]
            )
            print(rows[-1], flush=True)
    header = ["method", "largest train-loss gap", "accuracy cpu / device", "seconds cpu / device"]
    print(markdown_table(header, rows))
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        args.out / "device_check.json",
        {"device": args.device, "rounds": args.rounds, "methods": records, "worst_gap": worst},
    )
    if worst > args.tolerance:
        sys.exit(f"largest train-loss gap {worst:.2e} is above the tolerance {args.tolerance}")


if __name__ == "__main__":
    main()
