"""GWTF against SWARM on the same scenarios, churn and seeds, with real stage computations.

A run simulates one router on one scenario and churn schedule (`routers.simulate`), then replays
the microbatches it trained, on the paths they were finally trained on, through real pipeline
stages of a language model (`stages.PipelineTrainer`), so the loss curve is real and its time axis
is the simulated wall clock. Each run is one JSON file; a comparison is a grid of runs, resumable
(a finished run is not redone), and its report compares the routers cell by cell.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedflood.files import atomic_write_json_gz, read_json
from seedflood.pipeline.costs import Scenario, random_scenario
from seedflood.pipeline.records import SimResult
from seedflood.pipeline.routers import optimal_plan, simulate
from seedflood.pipeline.routing import DecentralizedPlanner, Planner
from seedflood.pipeline.stages import PipelineTrainer, split_llama

PLANNERS = ("decentralized", "replan", "optimal")


def planner(name: str, seed: int) -> Planner:
    """GWTF's routing: the decentralized algorithm repairing its flow through churn (what GWTF
    runs), the same algorithm started afresh at every membership change (to compare), or the
    centralized optimum."""
    if name in ("decentralized", "replan"):
        return DecentralizedPlanner(seed, repair=name == "decentralized")
    if name == "optimal":
        return optimal_plan
    raise ValueError(f"planner must be one of {', '.join(PLANNERS)}; got {name!r}")


def text_batches(
    texts: Sequence[str], tokenizer: Any, micro_batch: int, max_length: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Microbatches of next-token prediction over ``texts``, cycling forever in a fixed order."""
    for start in itertools.count(0, micro_batch):
        chunk = [texts[(start + k) % len(texts)] for k in range(micro_batch)]
        encoded = tokenizer(
            chunk, return_tensors="pt", padding=True, truncation=True, max_length=max_length
        )
        yield {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": encoded["input_ids"],
        }


def replay_losses(
    result: SimResult,
    model: torch.nn.Module,
    stages: int,
    batches: Iterator[dict[str, torch.Tensor]],
    lr: float,
) -> list[dict[str, float]]:
    """Train real stages on the trace: per iteration, the microbatches the simulator trained, each
    through the relays whose gradients entered the average. Returns (simulated time, loss) per
    iteration. A relay is a replica of its stage; a relay SWARM moved to another stage is a new
    replica there (it downloads that stage's parameters, as every idle replica has them)."""
    replicas: list[dict[str, int]] = [{} for _ in range(stages)]
    for record in result.iterations:
        for trained in record.trained:
            for stage, relay in enumerate(trained.path):
                replicas[stage].setdefault(relay, len(replicas[stage]))
    trainer = PipelineTrainer(split_llama(model, stages), [max(1, len(r)) for r in replicas])
    curve = []
    for record in result.iterations:
        if not record.trained:
            continue
        microbatches = [next(batches) for _ in record.trained]
        paths = [
            [replicas[stage][relay] for stage, relay in enumerate(trained.path)]
            for trained in record.trained
        ]
        loss = trainer.train_iteration(microbatches, paths, lr)
        curve.append({"time_s": record.end_s, "loss": loss, "iteration": record.index})
    return curve


@dataclass(frozen=True)
class RunSpec:
    """One cell of a comparison: a router on a seeded scenario under a churn preset, its links
    stretched by ``link_spread`` (costs.Scenario)."""

    router: str
    resources: str  # "heterogeneous" or "homogeneous"
    churn: str
    seed: int
    link_spread: float = 1.0

    @property
    def name(self) -> str:
        """The default spread stays out of the name, so runs from before the sweep existed are
        found and skipped as done."""
        links = "" if self.link_spread == 1.0 else f"-links{self.link_spread:g}"
        return f"{self.resources}{links}-{self.churn}-s{self.seed}-{self.router}"

    def scenario(self, stages: int, relays_per_stage: int) -> Scenario:
        return random_scenario(
            self.seed,
            stages=stages,
            relays_per_stage=relays_per_stage,
            holders=2,
            microbatches=8,
            regions=10,
            heterogeneous=self.resources == "heterogeneous",
            link_spread=self.link_spread,
        )


def summarize(result: SimResult, microbatches: int) -> dict[str, Any]:
    """The figures a comparison quotes, from one simulation."""
    compute = result.compute
    busy = compute.useful_s + compute.recomputed_s + compute.discarded_s
    iteration_s = [r.end_s - r.start_s for r in result.iterations]
    return {
        "time_to_target_s": time_to(result, microbatches),
        "total_time_s": result.total_time_s,
        "throughput": result.throughput,
        "microbatches_trained": result.microbatches_trained,
        "wasted_fraction": (compute.recomputed_s + compute.discarded_s) / busy if busy else 0.0,
        "idle_fraction": compute.idle_s / compute.accounted_s if compute.accounted_s else 0.0,
        "iteration_s_median": statistics.median(iteration_s) if iteration_s else math.nan,
        "churn_events": sum(len(r.events) for r in result.iterations),
    }


def time_to(result: SimResult, microbatches: int) -> float:
    """Simulated seconds until ``microbatches`` microbatches were trained."""
    trained = 0
    for record in result.iterations:
        trained += record.microbatches
        if trained >= microbatches:
            return record.end_s
    return math.inf


def run_pipeline(
    scenario: Scenario,
    *,
    router: str,
    churn: str,
    seed: int,
    microbatches: int,
    plan: str = "decentralized",
    model: torch.nn.Module | None = None,
    tokenizer: Any = None,
    texts: Sequence[str] = (),
    lr: float = 0.05,
) -> dict[str, Any]:
    """Simulate one router, replay its trace through real stages when a model is given."""
    result = simulate(
        scenario,
        router=router,
        plan=planner(plan, seed),
        churn=churn,
        microbatches_target=microbatches,
        seed=seed,
    )
    record: dict[str, Any] = {
        "kind": "pipeline",
        "router": router,
        "churn": churn,
        "seed": seed,
        "planner": plan if router == "gwtf" else None,
        "microbatches_target": microbatches,
        "link_spread": scenario.link_spread,
        **summarize(result, microbatches),
        "compute": {
            "useful_s": result.compute.useful_s,
            "recomputed_s": result.compute.recomputed_s,
            "discarded_s": result.compute.discarded_s,
            "idle_s": result.compute.idle_s,
            "waste_by_cause": dict(result.compute.waste),
        },
        "iterations": [
            {
                "index": r.index,
                "start_s": r.start_s,
                "end_s": r.end_s,
                "microbatches": r.microbatches,
                "events": list(r.events),
            }
            for r in result.iterations
        ],
        "scenario": scenario.to_dict(),
    }
    if model is not None:
        torch.manual_seed(seed)
        batches = text_batches(texts, tokenizer, micro_batch=4, max_length=64)
        record["loss_curve"] = replay_losses(result, model, scenario.stages, batches, lr)
    return record


def compare_grid(
    out_dir: Path,
    *,
    seeds: Sequence[int],
    churn_levels: Sequence[str],
    resources: Sequence[str],
    microbatches: int,
    stages: int,
    relays_per_stage: int,
    routers: Sequence[str] = ("gwtf", "swarm"),
    link_spreads: Sequence[float] = (1.0,),
    train: Callable[[], tuple[torch.nn.Module, Any, Sequence[str]]] | None = None,
    show: Callable[[str], None] = lambda _name: None,
) -> list[dict[str, Any]]:
    """Every (resources, link spread, churn, seed) cell for each router; finished runs are read
    back."""
    runs = []
    model = tokenizer = None
    texts: Sequence[str] = ()
    for kind, spread, churn, seed, router in itertools.product(
        resources, link_spreads, churn_levels, seeds, routers
    ):
        spec = RunSpec(router, kind, churn, seed, spread)
        path = out_dir / "runs" / f"{spec.name}.json.gz"
        finished = [p for p in (path, path.with_suffix("")) if p.is_file()]  # or the older .json
        if finished:
            runs.append(read_json(finished[0]))
            continue
        show(spec.name)
        if train is not None and model is None:
            model, tokenizer, texts = train()
        record = run_pipeline(
            spec.scenario(stages, relays_per_stage),
            router=router,
            churn=churn,
            seed=seed,
            microbatches=microbatches,
            model=model,
            tokenizer=tokenizer,
            texts=texts,
        )
        record |= {"name": spec.name, "resources": kind}
        atomic_write_json_gz(path, record)
        runs.append(record)
    return runs
