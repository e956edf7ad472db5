"""`seedflood pipeline`: GWTF pipeline training under churn against SWARM, simulated, with the
traces replayed through real stages of a language model."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from seedflood.ui import USER_ERRORS, console
from seedflood.ui import fail as _fail
from seedflood.ui import progress as _progress

pipeline_app = typer.Typer(
    no_args_is_help=True, help="GWTF pipeline training under churn, against SWARM (simulated)."
)


def _churn(value: str) -> str:
    """A preset name, or crashes per relay-hour with as many joins (a steady population)."""
    from seedflood.pipeline.churn import resolve_rates
    from seedflood.pipeline.costs import ScenarioError

    try:
        resolve_rates(value)
    except ScenarioError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _churn_levels(value: str) -> list[str]:
    levels = [part.strip() for part in value.split(",") if part.strip()]
    if not levels or len(set(levels)) < len(levels):
        raise typer.BadParameter(
            f"{value!r}: give churn levels as a comma-separated list, each once, of presets "
            "(none, low, high) or crashes per relay-hour"
        )
    return [_churn(level) for level in levels]


def _listed(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """A comma-separated choice among ``allowed``, each named at most once."""
    chosen = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in allowed]
    if not chosen or unknown or len(set(chosen)) < len(chosen):
        raise typer.BadParameter(
            f"{value!r}: give {what} as a comma-separated list, each once, of {', '.join(allowed)}"
        )
    return chosen


def _spreads(value: str) -> list[float]:
    """Link spreads to sweep (costs.Scenario): 0 = alike links, 1 = the measured table."""
    try:
        spreads = [float(part) for part in value.split(",")]
    except ValueError:
        spreads = []
    usable = all(0 <= spread < math.inf for spread in spreads)  # NaN fails too
    if not spreads or not usable or len(set(spreads)) < len(spreads):
        raise typer.BadParameter(
            f"{value!r}: give link spreads as distinct numbers >= 0 separated by commas "
            "(0: every inter-region link alike, 1: the measured table, 2: its ratios squared)"
        )
    return spreads


def _lm_for_pipeline(model: str, data_dir: str | None, seed: int, stages: int) -> Any:
    """A model to pipeline and texts to train it on: SST-2 sentences with their labels."""
    from seedflood.learning.models import load_model
    from seedflood.learning.tasks import load_task

    def load() -> tuple[Any, Any, list[str]]:
        language_model, tokenizer = load_model(model, seed=seed, tiny_layers=max(2, stages))
        data = load_task(
            "sst2",
            data_dir=data_dir or os.environ.get("SEEDFLOOD_DATA_DIR") or None,
            seed=seed,
            n_train=512,
            n_val=1,
            n_test=1,
        )
        texts = [e.prompt + e.candidates[e.label] for e in data.train]
        return language_model, tokenizer, texts

    return load


@pipeline_app.command("run")
def pipeline_run(
    scenario_file: Annotated[
        Path, typer.Argument(help="YAML scenario (seedflood pipeline scenario)")
    ],
    router: Annotated[
        str, typer.Option(help="gwtf, swarm (trainer hub) or swarm-direct (server to server)")
    ] = "gwtf",
    churn: Annotated[str, typer.Option(help="none, low, high, or crashes per relay-hour")] = "none",
    microbatches: Annotated[int, typer.Option(help="Train until this many microbatches")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the churn schedule and the routers")] = 0,
    planner: Annotated[
        str,
        typer.Option(
            help="GWTF routing: decentralized (repairs its flow through churn), replan "
            "(the same algorithm afresh at every change) or optimal (centralized)"
        ),
    ] = "decentralized",
    train: Annotated[bool, typer.Option(help="Replay the trace through real stages")] = True,
    model: Annotated[str, typer.Option(help="Model whose stages are trained")] = "tiny",
    out: Annotated[Path | None, typer.Option(help="Results directory")] = None,
) -> None:
    """Simulate one router on one scenario; write pipeline.json for `seedflood report`."""
    from seedflood.files import atomic_write_json
    from seedflood.pipeline.costs import Scenario, ScenarioError
    from seedflood.pipeline.experiment import run_pipeline

    rates = _churn(churn)
    try:
        scenario = Scenario.load(scenario_file)
        language_model = tokenizer = None
        texts: list[str] = []
        if train:
            language_model, tokenizer, texts = _lm_for_pipeline(
                model, None, seed, scenario.stages
            )()
        record = run_pipeline(
            scenario,
            router=router,
            churn=rates,
            seed=seed,
            microbatches=microbatches,
            plan=planner,
            model=language_model,
            tokenizer=tokenizer,
            texts=texts,
        )
    except (ScenarioError, ValueError, *USER_ERRORS) as error:
        raise _fail(error) from None
    record |= {"name": f"{scenario_file.stem}-{router}", "resources": scenario_file.stem}
    record["churn"] = churn
    out_dir = out or Path("results") / f"pipeline-{scenario_file.stem}-{router}"
    atomic_write_json(out_dir / "pipeline.json", record)
    console.print(
        f"{router}: {record['microbatches_trained']} microbatches in {record['total_time_s']:.0f} "
        f"simulated s ({record['throughput']:.3f}/s), wasted {100 * record['wasted_fraction']:.1f}%"
        f", idle {100 * record['idle_fraction']:.1f}%; {out_dir}/pipeline.json"
    )


@pipeline_app.command("scenario")
def pipeline_scenario(
    out: Annotated[Path, typer.Argument(help="YAML file to write")],
    seed: Annotated[int, typer.Option()] = 0,
    stages: Annotated[int, typer.Option()] = 4,
    relays_per_stage: Annotated[int, typer.Option()] = 4,
    holders: Annotated[int, typer.Option()] = 2,
    regions: Annotated[int, typer.Option(help="How many of the 12 regions to use")] = 10,
    heterogeneous: Annotated[bool, typer.Option()] = True,
    link_spread: Annotated[
        float, typer.Option(help="0 = all inter-region links alike, 1 = the measured table")
    ] = 1.0,
    micro_batch: Annotated[int, typer.Option(help="Sequences per microbatch")] = 8,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence")] = 256,
    calibrate: Annotated[
        bool, typer.Option(help="Time a stage of SmolLM2-135M's shape here for compute_s")
    ] = False,
) -> None:
    """Write a seeded random scenario for SmolLM2-135M's shape (hidden size 576)."""
    from seedflood.pipeline.costs import ScenarioError, activation_bytes, random_scenario

    compute_s = 0.5
    if calibrate:
        from seedflood.pipeline.calibration import llama_from_smollm2, measure_stage_seconds
        from seedflood.pipeline.stages import split_llama

        parts = split_llama(llama_from_smollm2(), stages)
        compute_s = measure_stage_seconds(parts[len(parts) // 2], micro_batch, seq_len)
        console.print(f"a middle stage's forward takes {compute_s:.3f} s on this machine")
    try:
        scenario = random_scenario(
            seed,
            stages=stages,
            relays_per_stage=relays_per_stage,
            holders=holders,
            regions=regions,
            heterogeneous=heterogeneous,
            link_spread=link_spread,
            compute_s=compute_s,
            activation=activation_bytes(micro_batch, seq_len, 576),
        )
    except ScenarioError as error:
        raise _fail(error) from None
    scenario.save(out)
    console.print(f"{len(scenario.relays)} relays over {stages} stages in {out}")


@pipeline_app.command("compare")
def pipeline_compare(
    out: Annotated[Path, typer.Option(help="Comparison directory")] = Path(
        "results/pipeline-compare"
    ),
    seeds: Annotated[int, typer.Option(help="Seeds per cell")] = 3,
    microbatches: Annotated[int, typer.Option(help="Target microbatches per run")] = 200,
    stages: Annotated[int, typer.Option()] = 4,
    relays_per_stage: Annotated[int, typer.Option()] = 4,
    train: Annotated[bool, typer.Option(help="Replay traces through real stages")] = True,
    model: Annotated[str, typer.Option(help="Model whose stages are trained")] = "tiny",
    routers: Annotated[
        str, typer.Option(help="Comma-separated: gwtf, swarm, swarm-direct")
    ] = "gwtf,swarm",
    links: Annotated[
        str,
        typer.Option(
            help="Comma-separated link spreads: 0 = all inter-region links alike, 1 = the "
            "measured table, 2 = its ratios squared"
        ),
    ] = "1",
    churn: Annotated[
        str, typer.Option(help="Comma-separated churn presets or crashes per relay-hour")
    ] = "none,low,high",
    resources: Annotated[
        str, typer.Option(help="Comma-separated: homogeneous, heterogeneous")
    ] = "homogeneous,heterogeneous",
) -> None:
    """GWTF vs SWARM over relays, link spreads and churn presets (default: homogeneous and
    heterogeneous relays, the measured links of 10 regions, no/low/high churn)."""
    from seedflood.pipeline.experiment import compare_grid
    from seedflood.pipeline.report import write_pipeline_report
    from seedflood.pipeline.routers import ROUTERS

    chosen_routers = _listed(routers, ROUTERS, "routers")
    spreads = _spreads(links)
    churn_levels = _churn_levels(churn)
    kinds = _listed(resources, ("homogeneous", "heterogeneous"), "relay kinds")
    cells = seeds * len(chosen_routers) * len(spreads) * len(churn_levels) * len(kinds)
    with _progress("[bold]runs") as bar:
        task = bar.add_task("runs", total=cells, status="")

        def show(name: str) -> None:
            bar.update(task, completed=len(list((out / "runs").glob("*.json*"))), status=name)

        try:
            runs = compare_grid(
                out,
                seeds=range(seeds),
                churn_levels=churn_levels,
                resources=kinds,
                routers=chosen_routers,
                link_spreads=spreads,
                microbatches=microbatches,
                stages=stages,
                relays_per_stage=relays_per_stage,
                train=_lm_for_pipeline(model, None, 0, stages) if train else None,
                show=show,
            )
        except USER_ERRORS as error:
            raise _fail(error) from None
        bar.update(task, completed=cells)
    console.print(f"report: {write_pipeline_report(runs, out)}")


@pipeline_app.command("flow")
def pipeline_flow(
    scenario_file: Annotated[Path, typer.Argument(help="YAML scenario")],
    seed: Annotated[int, typer.Option(help="Seed of the decentralized algorithm")] = 0,
) -> None:
    """Route one iteration: the centralized optimum against GWTF's decentralized algorithm."""
    from seedflood.pipeline.costs import Scenario, ScenarioError
    from seedflood.pipeline.flow import optimal_flow
    from seedflood.pipeline.gwtf.algorithm import decentralized_flow

    try:
        scenario = Scenario.load(scenario_file)
    except ScenarioError as error:
        raise _fail(error) from None
    for name, solution in (
        ("centralized", optimal_flow(scenario)),
        ("decentralized", decentralized_flow(scenario, seed)),
    ):
        console.print(
            f"{name:>13}: {solution.value} microbatches, max path cost "
            f"{solution.max_path_cost:.3f} s, iteration {solution.iteration_time():.3f} s, "
            f"{solution.cost_per_microbatch():.3f} s per microbatch, solved in "
            f"{solution.seconds:.3f} s"
            + ("" if solution.settled else " [bold red](stopped at its tick limit, unsettled)")
        )
