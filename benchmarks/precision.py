"""bf16 forwards against fp32 on one SeedFlood config: how far the scalars move, and what that does
to accuracy at equal steps.

1. Scalars, on one trajectory. The fp32 run is followed for its first --messages messages
   (⌈messages / clients⌉ rounds). At every step each client's scalar is computed twice on the
   same model, seed and batch: with fp32 forwards (the scalar the run floods and applies) and with
   --dtype forwards (discarded). Two separate runs would compare estimates on models that drifted
   apart after their first differing step; one trajectory isolates the estimate's own error.
   Reported: the relative error ‖s_low − s_fp32‖₂ / ‖s_fp32‖₂ over all messages, the median and
   90th percentile of the per-message |s_low − s_fp32| / |s_fp32| (large where s_fp32 is near 0),
   and the share of messages whose sign agrees.
2. Accuracy. Two full runs of --rounds rounds (`seedflood run`'s loop), in fp32 and in --dtype:
   test accuracy at equal steps, and their wall seconds.

The device is $SEEDFLOOD_DEVICE's, as for every simulation. Writes OUT/precision.json (and the two
runs' folders beside it) and prints a table:

    SEEDFLOOD_DATA_DIR=../shared/data .venv/bin/python benchmarks/precision.py --rounds 20
    SEEDFLOOD_DEVICE=cuda .venv/bin/python benchmarks/precision.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.build import on_device, run_precision
from seedflood.config import RunConfig, load_config
from seedflood.files import atomic_write_json
from seedflood.report import markdown_table
from seedflood.sim.devices import run_device
from seedflood.sim.runner import build, run


def scalar_pairs(config: RunConfig, low: RunConfig, messages: int) -> tuple[list[float], ...]:
    """The first ``messages`` scalars of ``config``'s run, and the same clients' scalars at the
    same steps on the same models with ``low``'s forward precision."""
    if config.steps_per_round != 1:
        raise SystemExit("the scalar comparison follows one step per round (local_steps: 1)")
    device = run_device()
    torch.manual_seed(config.seed)
    exact: list[float] = []
    approximate: list[float] = []
    with on_device(device):
        algorithm = build(config, device).algorithm
        assert isinstance(algorithm, SeedFlood)
        for round_index in range(math.ceil(messages / config.clients)):
            with run_precision(low, device):
                approximate += [s for s, _ in algorithm.estimates(round_index)]
            scalars = [s for s, _ in algorithm.estimates(round_index)]
            exact += scalars
            # the round the run makes, without estimating its scalars a second time
            made = [algorithm.make_message(round_index, c, s) for c, s in enumerate(scalars)]
            algorithm.replay_round(round_index, made)
    return exact[:messages], approximate[:messages]


def compare_scalars(exact: list[float], approximate: list[float]) -> dict[str, float]:
    ref = torch.tensor(exact, dtype=torch.float64)
    low = torch.tensor(approximate, dtype=torch.float64)
    per_message = ((low - ref).abs() / ref.abs()).tolist()
    return {
        "messages": len(exact),
        "relative_error": float((low - ref).norm() / ref.norm()),
        "median_relative_error": statistics.median(per_message),
        "p90_relative_error": statistics.quantiles(per_message, n=10)[-1],
        "same_sign": float((low.sign() == ref.sign()).double().mean()),
        "mean_abs_scalar_fp32": float(ref.abs().mean()),
    }


KEPT = ("accuracy", "zero_shot_accuracy", "steps", "state_hash", "wall_seconds", "device")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/quickstart.yaml"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--out", type=Path, default=Path("results/bench/precision"))
    args = parser.parse_args()
    keys = [f"model={args.model}", f"rounds={args.rounds}", "save_model=false"]
    config = load_config(args.config, [*keys, "dtype=fp32"])
    low = load_config(args.config, [*keys, f"dtype={args.dtype}"])
    exact, approximate = scalar_pairs(config, low, args.messages)
    scalars = compare_scalars(exact, approximate)
    print(f"scalars over {scalars['messages']} messages: {scalars}", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    for run_config in (config, low):
        results = run(run_config, args.out / run_config.dtype)
        runs[run_config.dtype] = {key: results[key] for key in KEPT}
        print(f"{run_config.dtype}: {runs[run_config.dtype]}", flush=True)
    record = {
        "model": args.model,
        "config": str(args.config),
        "rounds": args.rounds,
        "dtype": args.dtype,
        "method": "scalars recomputed with the low-precision forwards on the fp32 trajectory",
        "scalars": scalars,
        "runs": runs,
    }
    atomic_write_json(args.out / "precision.json", record)
    errors = {
        "fp32": ["–", "–", "–"],
        args.dtype: [
            f"{scalars['relative_error']:.3f}",
            f"{scalars['median_relative_error']:.3f} / {scalars['p90_relative_error']:.3f}",
            f"{scalars['same_sign']:.1%}",
        ],
    }
    header = ["forwards", "scalar rel. error", "median / p90 per message", "same sign"]
    header += [f"test accuracy after {args.rounds} steps", "wall s"]
    rows = [
        [name, *errors[name], f"{runs[name]['accuracy']:.1%}", f"{runs[name]['wall_seconds']:.0f}"]
        for name in runs
    ]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
