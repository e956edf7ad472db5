"""What faulty links cost SeedFlood: repair exchanges and bytes, and whether the result changes.

For each fault (none; loss 5/20/50 %; duplication 20 %; reordering 50 %; delay 20 %; a partition
of the ring into halves) one run on a 16-client ring, hops = diameter, trains the same task from
the same seed. Anti-entropy repairs what the links broke; the table says how many exchanges a
round needed, how many rounds ended without full delivery (a partition: until it healed), what
repair cost per edge next to flooding, and whether the final accuracy and committed-state hash
equal the fault-free run's. By default the tiny random model on synthetic sentences, so it runs
in a few minutes on a laptop; --model and --data-dir run it on a real model and task.

    python benchmarks/faults.py [--rounds 40] [--model tiny] [--data-dir DIR] [--faults none,loss]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.learning.synthetic import write_synthetic_sst2
from seedflood.report import markdown_table
from seedflood.sim.runner import run

FAULTS: list[tuple[str, str, dict[str, Any]]] = [
    ("none", "-", {}),
    ("loss", "5%", {"link_loss": 0.05}),
    ("loss", "20%", {"link_loss": 0.2}),
    ("loss", "50%", {"link_loss": 0.5}),
    ("duplicate", "20%", {"link_duplicate": 0.2}),
    ("reorder", "50%", {"link_reorder": 0.5}),
    ("delay", "20%", {"link_delay": 0.2, "link_delay_hops": 2}),
    ("partition", "halves", {}),
]


def row(name: str, rate: str, results: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    cut = results["config"]["cut_rounds"]
    healed = results.get("full_delivery_round")
    return {
        "fault": name,
        "rate": rate,
        "exchanges_per_round_mean": results.get("repair_exchanges_mean", 0.0),
        "exchanges_per_round_max": results.get("repair_exchanges_max", 0),
        "rounds_without_full_delivery": results.get("rounds_without_full_delivery", 0),
        "rounds_to_heal": None if cut is None or healed is None else healed - cut[1],
        "repair_bytes_per_edge_max": results["repair_bytes_per_edge_max"],
        "repair_bytes_per_edge_mean": results["repair_bytes_per_edge_mean"],
        "flood_bytes_per_edge_max": results["bytes_per_edge_max"],
        "accuracy": results["accuracy"],
        "accuracy_change": results["accuracy"] - clean["accuracy"],
        "same_hash": results["state_hash"] == clean["state_hash"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = [
        "fault",
        "rate",
        "exchanges/round (mean, max)",
        "rounds not fully delivered",
        "repair B/edge (max, mean)",
        "flood B/edge max",
        "accuracy (vs none)",
        "same hash",
    ]
    return markdown_table(
        header,
        (
            [
                r["fault"],
                r["rate"],
                f"{r['exchanges_per_round_mean']:.2f}, {r['exchanges_per_round_max']}",
                f"{r['rounds_without_full_delivery']}"
                + ("" if r["rounds_to_heal"] is None else f", healed +{r['rounds_to_heal']}"),
                f"{r['repair_bytes_per_edge_max']:,.0f}, {r['repair_bytes_per_edge_mean']:,.0f}",
                f"{r['flood_bytes_per_edge_max']:,.0f}",
                f"{r['accuracy']:.3f} ({r['accuracy_change']:+.3f})",
                "yes" if r["same_hash"] else "no",
            ]
            for r in rows
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--data-dir", default=None, help="default: synthetic SST-2 sentences")
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument(
        "--faults", default=None, help="comma-separated fault names to run (default: all)"
    )
    parser.add_argument("--out", default="results/bench/faults.json")
    args = parser.parse_args()
    names = {f[0] for f in FAULTS}
    wanted = set(args.faults.split(",")) if args.faults else names
    if wanted - names or "none" not in wanted:
        parser.error(f"--faults takes names among {', '.join(sorted(names))}, 'none' included")
    faults = [f for f in FAULTS if f[0] in wanted]
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data_dir or str(write_synthetic_sst2(Path(scratch) / "data"))
        base = {
            "model": args.model,
            "data_dir": data_dir,
            "clients": args.clients,
            "topology": "ring",
            "n_train": 512,
            "n_val": 100,
            "n_test": 100,
            "rounds": args.rounds,
            "eval_every": args.rounds,
            "batch_size": 8,
            "lr": 1e-2,
            "max_length": args.max_length,
            "link_seed": 1,
        }
        partition = {"cut_rounds": (args.rounds // 4, args.rounds // 2)}
        results = []
        for name, rate, fault in faults:
            chosen = partition if name == "partition" else fault
            results.append(run(RunConfig(**base, **chosen), Path(scratch) / f"{name}-{rate}"))
            print(f"done: {name} {rate}", flush=True)
    rows = [
        row(name, rate, r, results[0]) for (name, rate, _), r in zip(faults, results, strict=True)
    ]
    print(table(rows))
    atomic_write_json(
        args.out,
        {"rounds": args.rounds, "clients": args.clients, "model": args.model, "rows": rows},
    )


if __name__ == "__main__":
    main()
