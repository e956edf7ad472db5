"""Whether GWTF's decentralized flow settles at the optimum on deep pipelines, and how close.

For every shape stages x relays per stage and each of --seeds seeds, the comparison's random
scenario (2 data holders of 8 microbatches each, 10 regions, heterogeneous relays) is routed by
the decentralized flow, with its default tick limit (MAX_SWEEPS sweeps, growing with the stages),
and by the centralized optimum. Per run it records the microbatches routed against the optimum's,
whether the flow settled before its limit, the ticks it took, and its slowest-path and total cost
over the optimum's (where it routes as many). Prints a table per shape and writes
OUT/flow_convergence.json:

    nice -n 10 .venv/bin/python benchmarks/flow_convergence.py --stages 12 14 16 \\
        --relays 3 5 8 --seeds 10 --out results/bench
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from timing import machine

from seedflood.files import atomic_write_json
from seedflood.pipeline.costs import random_scenario
from seedflood.pipeline.flow import optimal_flow, validate
from seedflood.pipeline.gwtf.algorithm import MAX_SWEEPS, DecentralizedFlow
from seedflood.pipeline.gwtf.moves import sweep_ticks
from seedflood.report import markdown_table


def run_one(seed: int, stages: int, relays: int) -> dict[str, Any]:
    """One scenario routed both ways; the ratios are None where the flow routes fewer."""
    scenario = random_scenario(
        seed,
        stages=stages,
        relays_per_stage=relays,
        holders=2,
        microbatches=8,
        regions=10,
        heterogeneous=True,
    )
    reference = optimal_flow(scenario)
    started = time.perf_counter()
    flow = DecentralizedFlow(scenario, seed)
    solution = flow.run()
    seconds = time.perf_counter() - started
    validate(scenario, solution)
    compared = solution.value == reference.value and reference.value > 0
    return {
        "stages": stages,
        "relays_per_stage": relays,
        "seed": seed,
        "routed": solution.value,
        "optimum": reference.value,
        "settled": solution.settled,
        "ticks": flow.tick,
        "slowest_ratio": solution.max_path_cost / reference.max_path_cost if compared else None,
        "total_ratio": solution.total_cost / reference.total_cost if compared else None,
        "messages": flow.messages_sent,
        "seconds": seconds,
    }


def summary(stages: int, relays: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["slowest_ratio"] for r in runs if r["slowest_ratio"] is not None]
    totals = [r["total_ratio"] for r in runs if r["total_ratio"] is not None]
    ticks = [r["ticks"] for r in runs]
    return {
        "stages": stages,
        "relays_per_stage": relays,
        "runs": len(runs),
        "tick_limit": MAX_SWEEPS * sweep_ticks(stages),
        "short": sum(r["routed"] < r["optimum"] for r in runs),
        "unsettled": sum(not r["settled"] for r in runs),
        "ticks_median": statistics.median(ticks),
        "ticks_max": max(ticks),
        "slowest_ratio_median": statistics.median(ratios) if ratios else None,
        "slowest_ratio_max": max(ratios) if ratios else None,
        "total_ratio_median": statistics.median(totals) if totals else None,
        "total_ratio_max": max(totals) if totals else None,
        "seconds_mean": statistics.mean(r["seconds"] for r in runs),
    }


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def table(shapes: list[dict[str, Any]]) -> str:
    header = [
        "stages x relays",
        "runs",
        "short of optimum",
        "unsettled",
        "ticks (median, max; limit)",
        "slowest path (median, max)",
        "total cost (median, max)",
        "s per run",
    ]
    return markdown_table(
        header,
        (
            [
                f"{s['stages']} x {s['relays_per_stage']}",
                str(s["runs"]),
                str(s["short"]),
                str(s["unsettled"]),
                f"{s['ticks_median']:g}, {s['ticks_max']}; {s['tick_limit']}",
                f"{_ratio(s['slowest_ratio_median'])}, {_ratio(s['slowest_ratio_max'])}",
                f"{_ratio(s['total_ratio_median'])}, {_ratio(s['total_ratio_max'])}",
                f"{s['seconds_mean']:.1f}",
            ]
            for s in shapes
        ),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[12, 14, 16])
    parser.add_argument("--relays", type=int, nargs="+", default=[3, 5, 8])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seed0", type=int, default=0, help="the first seed")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    logging.getLogger("seedflood.pipeline.gwtf").setLevel(logging.ERROR)  # unsettled: counted
    started = time.perf_counter()
    runs, shapes = [], []
    for stages in args.stages:
        for relays in args.relays:
            shape = [
                run_one(seed, stages, relays) for seed in range(args.seed0, args.seed0 + args.seeds)
            ]
            runs += shape
            shapes.append(summary(stages, relays, shape))
            print(f"done: {stages} x {relays}", flush=True)
    print(table(shapes))
    wall = time.perf_counter() - started
    print(f"{len(runs)} runs in {wall:.0f} s")
    result: dict[str, Any] = {"machine": machine(), "seeds": args.seeds, "seed0": args.seed0}
    result |= {"wall_s": wall, "shapes": shapes, "runs": runs}
    atomic_write_json(args.out / "flow_convergence.json", result)


if __name__ == "__main__":
    main()
