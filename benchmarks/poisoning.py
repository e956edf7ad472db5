"""How far one poisoning client moves SeedFlood, with and without robust scalar clipping.

Client 0 floods ``factor`` × its honest scalar every step (a validly formed message: only its size
gives it away). For each factor the same run is made with clipping off and on (clip_multiple c,
clip_window W); the table gives final test accuracy, its change from the honest run, the
parameter distance (L2) from the honest run's final model, and how many scalars were clipped; the
honest run is the one without attacker under the same clipping setting (factor 1). By
default the tiny model on the synthetic task, a few minutes on a laptop.

    python benchmarks/poisoning.py [--rounds 30] [--clip 3] [--model tiny] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.learning.synthetic import write_synthetic_sst2
from seedflood.report import markdown_table
from seedflood.sim.runner import build, evaluate

FACTORS = (1.0, 10.0, 100.0, 1_000.0, 10_000.0)


def train(config: RunConfig) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Run ``config`` to the end in memory: final metrics and the trained matrices."""
    exp = build(config)
    for round_index in range(config.rounds):
        exp.algorithm.run_round(round_index)
    metrics = {**evaluate(exp, exp.test), **exp.algorithm.describe()}
    return metrics, [m.detach().clone() for m in exp.algorithm.direction.matrices]


def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(sum(((x - y).double() ** 2).sum() for x, y in zip(a, b, strict=True)) ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--clip", type=float, default=3.0, help="clip_multiple when clipping")
    parser.add_argument("--window", type=int, default=8, help="clip_window")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--data-dir", default=None, help="default: the synthetic task")
    parser.add_argument("--out", default="results/bench/poisoning.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        base = RunConfig(
            model=args.model,
            data_dir=args.data_dir or str(write_synthetic_sst2(Path(scratch))),
            clients=args.clients,
            n_train=512,
            n_val=100,
            n_test=100,
            rounds=args.rounds,
            batch_size=8,
            lr=1e-2,
            max_length=32,
        )
        for clip in (None, args.clip):
            clipping = base.model_copy(update={"clip_multiple": clip, "clip_window": args.window})
            honest, honest_model = train(RunConfig(**clipping.model_dump()))
            for factor in FACTORS:
                changes = {"attackers": 1, "attack_factor": factor} if factor != 1 else {}
                config = RunConfig(**{**clipping.model_dump(), **changes})
                result, model = (honest, honest_model) if factor == 1 else train(config)
                rows.append(
                    {
                        "factor": factor,
                        "clip_multiple": clip,
                        "accuracy": result["accuracy"],
                        "accuracy_change": result["accuracy"] - honest["accuracy"],
                        "distance_from_honest": distance(model, honest_model),
                        "clipped_messages": result.get("clipped_messages", 0),
                    }
                )
                print(f"done: factor {factor:g}, clip {clip}", flush=True)
    header = ["factor", "clipping", "accuracy", "change vs honest run", "distance", "clipped"]
    lines = markdown_table(
        header,
        (
            [
                f"{r['factor']:,.0f}",
                "off" if r["clip_multiple"] is None else f"c = {r['clip_multiple']:g}",
                f"{r['accuracy']:.3f}",
                f"{100 * r['accuracy_change']:+.1f} pt",
                f"{r['distance_from_honest']:.4f}",
                str(r["clipped_messages"]),
            ]
            for r in rows
        ),
    )
    print(lines)
    atomic_write_json(
        args.out,
        {"config": base.model_dump(), "rows": rows},
    )


if __name__ == "__main__":
    main()
