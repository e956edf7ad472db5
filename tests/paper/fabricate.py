"""Fabricated results in the schemas the project writes (results/*/runs/*/results.json, the
bench JSONs, pipeline runs): a schema change that breaks the document breaks the tests built on
these."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_run(root: Path, directory: str, name: str, accuracy: float, **config: object) -> None:
    """One results.json in the shape the simulator writes (only the fields the generator reads
    differ between runs); clients hold the averaged model unless ``client_accuracy`` says not."""
    client_accuracy = float(config.pop("client_accuracy", accuracy))  # type: ignore[arg-type]
    consensus_distance = float(config.pop("consensus_distance", 0.0))  # type: ignore[arg-type]
    zero_shot = float(config.pop("zero_shot", 0.496))  # type: ignore[arg-type]
    wall_seconds = float(config.pop("wall_seconds", 120.0))  # type: ignore[arg-type]
    majority = {k: config.pop(k) for k in ("majority_accuracy", "device", "guard") if k in config}
    full = {"label": name.split("_")[0], "model": "smollm2-135m", "task": "sst2", "clients": 16}
    full |= {"topology": "ring", "rounds": 30, "local_steps": 1, "batch_size": 8, "lr": 0.01}
    full |= {"eps": 0.001, "direction": "subcge", "rank": 32, "refresh": 1000, "hops": None}
    full |= {"n_train": 1024, "n_test": 500, "seed": 0, **config}
    method = str(full["label"])
    results = {
        "accuracy": accuracy,
        "client_accuracy_mean": client_accuracy,
        "consensus_distance": consensus_distance,
        "bytes_per_edge_max": 3840.0 if method.startswith(("seedflood", "hops")) else 3.2e9,
        "clients": full["clients"],
        "config": full,
        "data_notes": [],
        "diameter": int(full["clients"]) // 2,
        "method": method,
        "rounds": full["rounds"],
        "steps": full["rounds"],
        "topology": full["topology"],
        "train_seconds": 100.0,
        "wall_seconds": wall_seconds,
        "zero_shot_accuracy": zero_shot,
        **majority,
    }
    path = root / "results" / directory / "runs" / name / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(results))


def write_bench(root: Path) -> None:
    bench = root / "results" / "bench"
    bench.mkdir(parents=True)
    row = {"local_steps": 5, "scalar_format": "fp32", "bytes_per_edge_max": 399584.0}
    row |= {"bytes_per_message": 4.9948, "messages_per_edge_max": 80000.0}
    flood = {"clients": 16, "steps": 5000, "topology": "ring", "paper_bytes_per_edge": 400000}
    (bench / "flood_bytes.json").write_text(json.dumps({**flood, "rows": [row]}))
    apply_rows = [
        {"messages": 1, "merged_seconds": 0.07, "scatter_seconds": 0.008},
        {"messages": 1024, "merged_seconds": 0.25, "scatter_seconds": 0.5},
    ]
    apply = {"model": "smollm2-135m", "parameters": 134515008, "rank": 32, "threads": 2}
    apply |= {"repeats": 5, "dense_messages_measured": 3, "dense_seconds_per_message": 0.5}
    (bench / "apply_cost.json").write_text(json.dumps({**apply, "rows": apply_rows}))


def write_pipeline_runs(
    directory: Path,
    times: dict[tuple[str, float], tuple[float, ...]],
    churn: str = "high",
    stages: int = 4,
    **extra: object,
) -> None:
    """Runs of a comparison in the simulator's schema: (router, link spread) → time per seed."""
    runs = directory / "runs"
    runs.mkdir(parents=True)
    scenario = {"stages": stages, "relays": [{}] * (4 * stages)}
    for (router, spread), per_seed in times.items():
        for seed, time_s in enumerate(per_seed):
            run = {"kind": "pipeline", "router": router, "resources": "homogeneous", **extra}
            run |= {"churn": churn, "seed": seed, "time_to_target_s": time_s, "iterations": []}
            run |= {"throughput": 200 / time_s, "wasted_fraction": 0.1, "idle_fraction": 0.5}
            run |= {"microbatches_target": 200, "link_spread": spread, "scenario": scenario}
            (runs / f"{churn}-{spread}-{seed}-{router}.json").write_text(json.dumps(run))


def write_pipeline(root: Path) -> None:
    results = root / "results"
    times = {("gwtf", 1.0): (600.0, 640.0), ("swarm", 1.0): (1000.0, 1000.0)}
    write_pipeline_runs(
        results / "pipeline-compare", times | {("swarm-direct", 1.0): (800.0, 800.0)}
    )
    spreads = {("gwtf", 0.0): (800.0, 820.0), ("swarm", 0.0): (1000.0, 1000.0)}
    spreads |= {("gwtf", 2.0): (500.0, 520.0), ("swarm", 2.0): (1000.0, 1000.0)}
    write_pipeline_runs(results / "pipeline-links", spreads)
    flow = [
        {"stages": 12, "relays_per_stage": 3, "routed": 8, "optimum": 8, "settled": True,
         "slowest_ratio": 1.01, "total_ratio": 1.02},
        {"stages": 16, "relays_per_stage": 8, "routed": 16, "optimum": 16, "settled": True,
         "slowest_ratio": 0.99, "total_ratio": 1.03},
    ]  # fmt: skip
    (results / "bench" / "flow_convergence.json").write_text(json.dumps({"runs": flow}))
    crashes = [
        {"stage": stage, "extra_forwards": [int(s == stage) for s in range(3)],
         "extra_backwards": [int(s == stage) for s in range(3)], "loss_equal": True,
         "weight_gap": gap, "recovery_seconds": seconds}
        for stage, gap, seconds in ((0, 1e-5, 0.1), (1, 2e-5, 0.2), (2, 8e-6, 0.3))
    ]  # fmt: skip
    recovery = {"layers": 6, "stages": 3, "replicas_per_stage": 2, "microbatches": 4, "rows": 2,
                "seq_len": 64, "restart_seconds": 1.5, "crashes": crashes}  # fmt: skip
    (results / "bench" / "crash_recovery.json").write_text(json.dumps(recovery))


def write_tuning_run(root: Path, method: str, lr: float, validation: float, test: float) -> None:
    write_run(root, "paper-tune-sst2", f"{method}_lr-{lr}", test, method=method, lr=lr)
    history = root / "results" / "paper-tune-sst2" / "runs" / f"{method}_lr-{lr}" / "history.jsonl"
    records = [{"round": 0, "accuracy": 0.4}, {"round": 30, "accuracy": validation}]
    history.write_text("".join(json.dumps(r) + "\n" for r in records))
