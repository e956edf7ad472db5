"""The grids at the papers' horizon (configs/paper/*-long.yaml), apart from the short grids: the
SST-2 comparison's runs take 33 times the steps of the short grid's, and pooling a 1,000-step
seed with 30-step seeds of the same method and topology would make a mean of two regimes. The
same holds for RTE and BoolQ on their full training sets and for the scaling, SubCGE and hops
grids at length, which `at_length` shows beneath their short sections.

Runs stopped before their end (a lent GPU's 15 minutes run out) leave a history and no results;
their last evaluation is shown as what it is. The first-order ones among them stood at a train
loss of exactly ln 2 (one answer for every sentence): on the GPU the mixing zeroed their states
(docs/performance.md), so the section calls them void rather than let them speak for their rates.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import matplotlib.pyplot as plt

from seedflood.files import read_jsonl
from seedflood.grid import plan
from seedflood.paper.bench import link, pct, rel
from seedflood.paper.ceiling import ceiling_lines, held_back, read_ceiling
from seedflood.paper.decisive import Pair, decisive_lines
from seedflood.paper.grids import (
    compare_command,
    in_progress,
    missing_runs,
    not_yet_run,
    unfinished,
)
from seedflood.paper.tuning import LONG, horizon_tuning_section, stopped_at, untuned_methods
from seedflood.paper.verdicts import (
    TO_BEAT,
    against,
    learned,
    main_verdict,
    percent_interval,
    so_far,
)
from seedflood.report import Run, present_runs, summarize

GRID, OUT = "main-sst2-long.yaml", "results/paper-main-sst2-long"
FIRST_ORDER_LOCAL_STEPS = 5  # the grid's gossip methods: 20 rounds of 5 local steps
FULL_FIRST_ORDER = ("dsgd", "choco")  # full-parameter runs of these on a GPU were broken
SUSPECT_ON_GPU = (
    "The full-parameter DSGD and ChocoSGD runs above stopped on a GPU are void, not their rates: "
    "they stood at a train loss of exactly ln 2 (or drifted apart) by step 25 at every rate tried, "
    "while the same 16-client DSGD configuration at lr 0.00125 trains on the CPU (train loss 0.489 "
    "at step 25; `results/bench/gpu-fo/dsgd-cpu-16-clients-lr-0.00125.history.jsonl`). The cause, "
    "found on an H200: torch's sparse product of the mixing matrix with the clients' states "
    "returned zeros there (`results/bench/gpu-fo/sparse-products-h200.json`); gossip mixes with "
    "a dense matrix on a GPU since. In the search below, full DSGD at lr 0.000625 trained all 100 "
    "steps on the CPU, and full ChocoSGD trained at all four rates on an H100 with dense mixing."
)


def horizon_section(root: Path, out: Path) -> list[str]:
    directory = root / OUT
    lines = [
        "## 1b. SST-2 at the papers' horizon: 1,000 zeroth-order and 100 first-order steps",
        "",
        f"configs/paper/{GRID}: 16 clients, all 872 test sentences, 3 seeds; SeedFlood on the "
        "ring alone (its ring and meshgrid runs end on one hash), the gossip methods on both.",
        "",
    ]
    runs = present_runs(directory)
    stopped = sorted(directory.glob("unfinished-*/*.history.jsonl"))
    search = horizon_tuning_section(root)
    if not runs and not stopped:
        return [*lines, *not_yet_run(GRID, OUT), *search, *_full_training_sets(root, out)]
    lines += _runs_table(runs, root)
    image = out.parent / "img" / "results_sst2_long.png"
    partial = [(p.name.removesuffix(".history.jsonl"), read_jsonl(p)) for p in stopped]
    _plot_curves(runs, partial, image, "stopped")
    lines += [f"![validation accuracy against steps, bytes and seconds]({link(image, out)})", ""]
    if stopped:
        lines += [
            "Stopped before their end (the lent GPU's time ran out), last evaluation shown:",
            "",
        ]
        lines += [_stopped_line(path, root) for path in stopped]
        lines.append("")
        if any(path.name.split("_")[0] in FULL_FIRST_ORDER for path in stopped):
            lines += [SUSPECT_ON_GPU, ""]
    lines += [
        *search,
        _horizon_verdict(root, runs),
        "",
    ]
    return [*lines, *unfinished(root, GRID, OUT), *_full_training_sets(root, out)]


FULL_TRAINING_GRIDS = {"rte": "main-rte-long.yaml", "boolq": "main-boolq-long.yaml"}


def _full_training_sets(root: Path, out: Path) -> list[str]:
    """RTE and BoolQ on their full-size training files, 300 zeroth-order and 30 first-order
    steps: what has run, its curves with those of the runs still going, what has not run, and
    the main table's verdict on what has."""
    lines = [
        "## 1c. RTE and BoolQ on their full training sets: 300 zeroth-order and 30 first-order "
        "steps",
        "",
        "1,024 training examples (64 a client), validation drawn from what training leaves, every "
        "test example (RTE 277, BoolQ 1,000; BoolQ's training rows were carved from its "
        "validation split, see the data's README); each grid file's header gives its plan.",
        "",
    ]
    ceiling = read_ceiling(root)
    held = held_back(ceiling)
    for task, grid in FULL_TRAINING_GRIDS.items():
        lines += [f"{task} (configs/paper/{grid}):", ""]
        results = f"results/paper-main-{task}-long"
        runs, running = present_runs(root / results), in_progress(root, grid, results)
        if task in held[1]:
            lines += [*(_runs_table(runs, root) if runs else []), *_moot(root, grid, results, task)]
        else:
            lines += _grid_state(root, grid, results, runs)
        if runs or running:
            image = out.parent / "img" / f"results_{task}_long.png"
            _plot_curves(runs, running, image, "running")
            alt = f"{task}: validation accuracy against steps, bytes and seconds"
            lines += [f"![{alt}]({link(image, out)})", ""]
    return lines + ceiling_lines(root, ceiling) + _full_training_verdict(root, held)


def _moot(root: Path, grid: str, out: str, task: str) -> list[str]:
    """In place of the runs a grid lacks, for a task its ceiling runs did not learn: they could
    not test the claim, so they leave the plan, and the line says why and how to make them."""
    missing = len(missing_runs(root, grid, out))
    if not missing:
        return []
    planned = len(plan(root / "configs" / "paper" / grid))
    return [
        f"Not planned: {missing} of the {planned} runs of configs/paper/{grid}, not made. "
        f"Centralized SGD did not learn {task} at any rate of the ceiling grid (below), so they "
        f"could not test the claim (`{compare_command(grid, out)}` still makes them).",
        "",
    ]


def _full_training_verdict(root: Path, held: tuple[str, list[str]]) -> list[str]:
    """The main table's verdict (``main_verdict``) on the full training sets' runs, "not yet
    decided" until both grids have finished, led by ``held`` (``held_back``) when the ceiling
    runs hold a task back. SeedFlood's ring seeds stand for the meshgrid too: with hops =
    diameter its runs end on one state hash on both."""
    outs = {grid: f"results/paper-main-{task}-long" for task, grid in FULL_TRAINING_GRIDS.items()}
    runs = [run for out in outs.values() for run in present_runs(root / out)]
    if not runs:
        return []
    rows = _seedflood_on_both_topologies(summarize(runs))
    complete = all(
        (root / "configs" / "paper" / grid).is_file() and not unfinished(root, grid, out)
        for grid, out in outs.items()
    )
    planned = "RTE and BoolQ × ring/meshgrid × 3 seeds"
    verdict = main_verdict(rows, complete, fallback=False, planned=planned)
    verdict = verdict if complete else so_far(verdict)
    reason, tasks = held
    if reason:  # it leads, since "What we found" reads a verdict's first sentence
        lead, _, rest = verdict.partition("** ")
        if set(tasks) >= set(FULL_TRAINING_GRIDS):
            lead = "**Verdict: untestable here."
        verdict = f"{lead}** {reason} {rest}"
    return [verdict, ""]


def at_length(
    root: Path, grid: str, out: str, pairs: Sequence[Pair] = (), claim: str = ""
) -> list[str]:
    """A short grid's section closes with its grid at the papers' horizon (configs/paper/*-long):
    the runs made so far, apart from the short grid's, or the command that makes them; with
    ``pairs``, the decisive cells read seed by seed and a verdict on ``claim``."""
    heading = [f"### At the papers' horizon: configs/paper/{grid}", ""]
    runs = present_runs(root / out)
    if not runs or not pairs:
        return [*heading, *_grid_state(root, grid, out, runs)]
    return [
        *heading,
        *_runs_table(runs, root),
        *decisive_lines(runs, pairs, claim),
        *unfinished(root, grid, out),
    ]


def _grid_state(root: Path, grid: str, out: str, runs: list[Run]) -> list[str]:
    """A grid's finished runs and the runs it still lacks, or the command that makes them all."""
    if not runs:
        return [f"Not yet run (`{compare_command(grid, out)}`; its plan is in its header).", ""]
    return [*_runs_table(runs, root), *unfinished(root, grid, out)]


def _seed_groups(runs: list[Run]) -> dict[tuple[str, str, str, int], list[float]]:
    """(method, task, topology, clients) → the test accuracies of its seeds."""
    groups: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    for run in runs:
        groups[run.group].append(run.results["accuracy"])
    return groups


METHODS = ("dsgd", "choco", "dsgd-lora", "choco-lora", "dzsgd", "dzsgd-lora")
SEEDS_NEEDED = 3


def _still_short(groups: dict[tuple[str, str, str, int], list[float]]) -> list[str]:
    """The cells that keep §1b's verdict open, as "method (k of n runs)": every rival needs 3
    seeds on both topologies, SeedFlood 3 on the ring (its meshgrid runs end on the same hash)."""
    seeds: dict[tuple[str, str], int] = defaultdict(int)
    for (method, _task, topology, _clients), values in groups.items():
        seeds[method, topology] += len(values)
    cells = [("seedflood", ("ring",)), *((m, ("ring", "meshgrid")) for m in METHODS)]
    return [
        f"{method} ({sum(min(seeds[method, t], SEEDS_NEEDED) for t in topologies)} of "
        f"{SEEDS_NEEDED * len(topologies)} runs)"
        for method, topologies in cells
        if any(seeds[method, t] < SEEDS_NEEDED for t in topologies)
    ]


def _horizon_verdict(root: Path, runs: list[Run]) -> str:
    """The main table's verdict (``main_verdict``) once every cell has its seeds, a rival not at
    its pick at this horizon marked untuned; before, what the runs say so far and which cells are
    still short, so the sentence shrinks as runs land."""
    groups = _seed_groups(runs)
    short = _still_short(groups)
    if not short:
        rows = _seedflood_on_both_topologies(summarize(runs))
        untuned = untuned_methods(root, runs, LONG)
        return main_verdict(rows, True, fallback=False, untuned=untuned)
    return (
        "**Verdict: not yet decided.** "
        + _measured_so_far(groups)
        + f"The claim needs every method at {SEEDS_NEEDED} seeds on both topologies (SeedFlood on "
        "the ring), at rates chosen at this horizon (configs/paper/tune-sst2-long.yaml; the rates "
        f"of the short grid do not carry); still short: {', '.join(short)}."
    )


def _seedflood_on_both_topologies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Summary rows with SeedFlood's ring rows standing for the meshgrid where a task has no
    meshgrid run of its own: with hops = diameter both end on one state hash."""
    meshgrid = {r["task"] for r in rows if r["method"] == "seedflood" and r["topology"] != "ring"}
    return rows + [
        r | {"topology": "meshgrid"}
        for r in rows
        if r["method"] == "seedflood" and r["topology"] == "ring" and r["task"] not in meshgrid
    ]


def _measured_so_far(groups: dict[tuple[str, str, str, int], list[float]]) -> str:
    """What the finished runs already say, so that a verdict still waiting for its rivals
    reports its numbers: SeedFlood's mean as a share of DSGD's, the paper's headline number, with
    both seed counts (a share over one DSGD seed is still moving); SeedFlood against each other
    method run so far (Welch's test on the seeds, so only where both sides have two or more),
    those told apart first; then each method's mean test accuracy with its 95% interval.
    SeedFlood's ring seeds stand for both topologies: with hops = diameter its meshgrid runs end
    on the same state hash."""
    ours = [
        value for group, values in groups.items() if group[0] == "seedflood" for value in values
    ]
    shares = [  # in this order because "What we found" keeps only the start
        f"SeedFlood at {pct(fmean(ours) / fmean(values))}% of DSGD on the {topology} "
        f"({len(ours)} seeds against {len(values)}; the paper: 94–96%)"
        for (method, _task, topology, _clients), values in groups.items()
        if method == "dsgd" and ours
    ]
    comparisons = [
        against(f"{method} on the {topology}", ours, {"accuracies": values})
        for (method, _task, topology, _clients), values in groups.items()
        if method != "seedflood" and len(ours) > 1 and len(values) > 1
    ]
    told_apart_first = [said for _order, said in sorted(comparisons, key=lambda c: c[0] == 0)]
    ranked = [f"SeedFlood {', '.join(told_apart_first)}"] if comparisons else []
    levels = [
        f"{method} on the {topology}: "
        f"{percent_interval(values)}% test over {len(values)} seed{'s' * (len(values) > 1)}"
        for (method, _task, topology, _clients), values in groups.items()
    ]
    parts = shares + ranked + levels
    return f"So far: {'; '.join(parts)}. " if parts else ""


def _by_seeds(runs: list[Run]) -> dict[str, list[float]]:
    """Test accuracies grouped by run name without its seed: one configuration's seeds."""
    groups: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        groups[re.sub(r"_seed-\d+", "", run.directory.name)].append(run.results["accuracy"])
    return dict(groups)


def _steps(results: dict) -> str:
    """The steps a run was given, and where its divergence guard stopped it if it did."""
    config = results["config"]
    steps = config["rounds"] * (config.get("local_steps") or 1)
    stop = stopped_at(results)
    if stop is None:
        return f"{steps:,}"
    return f"{stop:,} of {steps:,} (guard: {results['guard']['rule']})"


def _runs_table(runs: list[Run], root: Path) -> list[str]:
    """One line per run; a run that ended less than LEARNED above its floor (``Run.floor``) is
    marked where its accuracy stands, since a table of chance-level numbers reads as a ranking."""
    if not runs:
        return []
    lines = [
        "| method | topology | seed | steps | test accuracy (%) | to beat (%) | device "
        "| wall s | source |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        r = run.results
        mark = "" if learned(r["accuracy"], run.floor) else ", did not learn"
        lines.append(
            f"| {r['method']} | {r['topology']} | {r['config']['seed']} | {_steps(r)} "
            f"| {pct(r['accuracy'])}{mark} | {pct(run.floor)} "
            f"| {r.get('device', 'cpu')} | {r['wall_seconds']:.0f} "
            f"| `{rel(run.directory, root)}` |"
        )
    lines += [
        "",
        f"To beat: {TO_BEAT}; a run that does not is marked so.",
    ]
    means = [
        f"- {name}: {percent_interval(values)}% over {len(values)} seeds"
        for name, values in _by_seeds(runs).items()
        if len(values) > 1
    ]
    if means:
        lines += ["", "Mean test accuracy over seeds, with its 95% interval (Student's t):", ""]
    return [*lines, *means, ""]


def _stopped_line(path: Path, root: Path) -> str:
    history = [r for r in read_jsonl(path) if "train_loss" in r]
    name = path.name.removesuffix(".history.jsonl")
    if not history:
        return f"- {name}: no evaluation recorded (`{rel(path, root)}`)"
    last = history[-1]
    return (
        f"- {name}: round {last['round']}, train loss {last['train_loss']:.4f}, validation "
        f"accuracy {pct(last['accuracy'])}%, consensus distance {last['consensus_distance']:.3g} "
        f"(`{rel(path, root)}`)"
    )


def _plot_curves(
    runs: list[Run],
    partial: Sequence[tuple[str, list[dict[str, Any]]]],
    image: Path,
    partial_word: str,
) -> None:
    """Validation accuracy against steps, busiest-edge bytes and training seconds: one line per
    run, coloured by method, marked by seed, dotted on the meshgrid, dashed for the ``partial``
    runs that have not reached their end (labelled ``partial_word``: stopped, or running); the
    legend beside the panels, where it hides no curve."""
    curves = [(run.directory.name, run.history, "-") for run in runs if run.history]
    curves += [(name, history, "--") for name, history in partial]
    figure, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharey=True)
    colours: dict[str, str] = {}
    for name, history, style in curves:
        method = name.split("_")[0]
        colour = colours.setdefault(method, f"C{len(colours)}")
        steps_per_round = _steps_per_round(name, runs)
        seed = int(name.rsplit("_seed-", 1)[1])
        topology = name.split("topology-")[1].split("_")[0]
        label = f"{method} ({topology}, seed {seed}{', ' + partial_word if style == '--' else ''})"
        style = ":" if style == "-" and topology == "meshgrid" else style
        for axis, key in zip(axes, ("round", "bytes_per_edge_max", "train_seconds"), strict=True):
            points = [h for h in history if key in h and "accuracy" in h]
            x = [h[key] * steps_per_round if key == "round" else h[key] for h in points]
            if key == "bytes_per_edge_max":
                x = [max(value, 1.0) for value in x]
            accuracy = [100 * h["accuracy"] for h in points]
            axis.plot(x, accuracy, style, color=colour, marker="os^D"[seed % 4], label=label)
    axes[0].set(xlabel="local steps per client", ylabel="validation accuracy (%)")
    axes[1].set(xlabel="bytes on the busiest edge (log; none drawn at 1)", xscale="log")
    axes[2].set(xlabel="training seconds (device in the table)")
    if curves:
        axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    for axis in axes:
        axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(image, dpi=120, metadata={"Software": None}, bbox_inches="tight")
    plt.close(figure)


def _steps_per_round(name: str, runs: list[Run]) -> int:
    """Local steps a round: the run's own where it finished, else its method's in the grid file
    (a stopped run left no results)."""
    for run in runs:
        if run.directory.name == name:
            return int(run.results["config"].get("local_steps") or 1)
    return 1 if name.startswith(("seedflood", "dzsgd")) else FIRST_ORDER_LOCAL_STEPS
