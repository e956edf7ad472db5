"""The learning-rate search behind docs/results.md's main table: each method's grid and pick.

The paper tunes a learning rate per method; a comparison at hand-set rates measures the rates as
much as the methods. So every method runs a small grid (configs/paper/tune-*.yaml) and its rate is
the one with the best validation accuracy: the last evaluation in the run's history, which reads
the validation split, never the test set the main table reports. The section states the grid, the
validation accuracy of every point and the pick, and names main-table runs made at another rate.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from seedflood.grid import plan
from seedflood.paper.bench import pct, rel
from seedflood.report import Run, present_runs

SEARCH_GRID = "configs/paper/tune-sst2.yaml"


@dataclass(frozen=True)
class GridPoint:
    lr: float
    validation: float
    test: float
    source: str


def _validation_accuracy(run: Run) -> float:
    if not run.history or "accuracy" not in run.history[-1]:
        raise ValueError(f"{run.directory}: no evaluation in history.jsonl to tune on")
    return float(run.history[-1]["accuracy"])


def tuning_grids(root: Path) -> dict[tuple[str, str], list[GridPoint]]:
    """(task, method) → its grid points by rate, from every results/paper-tune-* directory."""
    grids: dict[tuple[str, str], list[GridPoint]] = defaultdict(list)
    for directory in sorted((root / "results").glob("paper-tune-*")):
        for run in present_runs(directory):
            config = run.results["config"]
            grids[config["task"], run.results["method"]].append(
                GridPoint(
                    lr=float(config["lr"]),
                    validation=_validation_accuracy(run),
                    test=float(run.results["accuracy"]),
                    source=rel(run.directory / "results.json", root),
                )
            )
    return {key: sorted(points, key=lambda p: p.lr) for key, points in sorted(grids.items())}


def pick(points: list[GridPoint]) -> GridPoint:
    """The best validation accuracy; a tie goes to the smaller rate, the safer of the two."""
    return max(points, key=lambda p: (p.validation, -p.lr))


def _picks(grids: dict[tuple[str, str], list[GridPoint]], task: str) -> dict[str, float]:
    return {
        method: pick(points).lr for (searched, method), points in grids.items() if searched == task
    }


def tuned_rates(root: Path, task: str = "sst2") -> dict[str, float]:
    """method → tuned learning rate for ``task`` (empty when no search has run). The search runs
    on SST-2 and its rates serve every task: a search per task would triple its cost here."""
    return _picks(tuning_grids(root), task)


def _missing_points(
    root: Path, grids: dict[tuple[str, str], list[GridPoint]]
) -> dict[str, list[float]]:
    """method → the search grid's rates with no run yet (empty without the grid file)."""
    grid = root / SEARCH_GRID
    if not grid.is_file():
        return {}
    done = {(method, p.lr) for (_, method), points in grids.items() for p in points}
    missing: dict[str, list[float]] = defaultdict(list)
    for run in plan(grid):
        if (run.config.name, run.config.lr) not in done:
            missing[run.config.name].append(run.config.lr)
    return dict(missing)


def _not_yet_run(missing: dict[str, list[float]]) -> list[str]:
    if not missing:
        return []
    methods = sorted(missing)
    listed = "; ".join(f"{m} at lr {', '.join(f'{lr:g}' for lr in missing[m])}" for m in methods)
    command = (
        f"seedflood compare {SEARCH_GRID} --out results/paper-tune-sst2 --only {','.join(methods)}"
    )
    return [f"Not yet run: {listed} (`{command}` runs them and skips the rest).", ""]


def tuning_section(root: Path, main_runs: list[Run]) -> list[str]:
    """Markdown: the grid per method with validation accuracy, the pick, and mismatches."""
    lines = ["### Learning rates: the search", ""]
    grids = tuning_grids(root)
    if not grids:
        return [
            *lines,
            "**Not yet run.** The main table uses hand-set rates until `seedflood compare "
            "configs/paper/tune-sst2.yaml --out results/paper-tune-sst2` has run.",
            "",
        ]
    lines += [
        "Each method's rate is the grid point with the best validation accuracy (200 validation "
        "examples, evaluated once at the end of the run; a tie goes to the smaller rate). Grid "
        "runs: SST-2, 16-client ring, seed 0, the main table's steps "
        "(configs/paper/tune-sst2.yaml); the SST-2 rates serve every task. Test accuracy of the "
        "same runs is shown for reference, not used to choose.",
        "",
        "| task | method | grid: lr → validation % (test %) | tuned lr | source of the pick |",
        "|---|---|---|---|---|",
    ]
    for (task, method), points in grids.items():
        best = pick(points)
        cells = ", ".join(f"{p.lr:g} → {pct(p.validation)} ({pct(p.test)})" for p in points)
        lines.append(f"| {task} | {method} | {cells} | **{best.lr:g}** | `{best.source}` |")
    lines.append("")
    missing = _missing_points(root, grids)
    lines += _not_yet_run(missing)
    rates = _picks(grids, "sst2")
    untuned = sorted(
        {
            f"{run.results['method']} on {run.results['config']['task']} at lr "
            f"{run.results['config']['lr']:g} (tuned: {rates[run.results['method']]:g})"
            for run in _off_pick(main_runs, rates)
        }
    )
    if untuned:
        lines += ["Main-table runs at a rate other than the tuned one: " + "; ".join(untuned), ""]
    not_searched = unsearched(main_runs, grids, missing)
    hand_set = sorted(
        {
            f"{method} (lr {run.results['config']['lr']:g})"
            for run in main_runs
            if (method := run.results["method"]) in not_searched
        }
    )
    if hand_set:
        lines += [
            "Not searched, or searched in part, at a hand-set rate: " + "; ".join(hand_set) + ". "
            "Their rows measure that rate as much as the method.",
            "",
        ]
    return lines


def unsearched(
    main_runs: list[Run],
    grids: dict[tuple[str, str], list[GridPoint]],
    missing: dict[str, list[float]],
) -> set[str]:
    """Main-table methods whose search has not run, or not every point of it."""
    searched = {method for _, method in grids} - set(missing)
    return {run.results["method"] for run in main_runs} - searched


def untuned_methods(root: Path, main_runs: list[Run]) -> set[str]:
    """Main-table methods whose rows are not at a searched pick: ``unsearched`` ones, and those
    with a run at a rate other than their search's pick."""
    grids = tuning_grids(root)
    off_pick = {run.results["method"] for run in _off_pick(main_runs, _picks(grids, "sst2"))}
    return unsearched(main_runs, grids, _missing_points(root, grids)) | off_pick


def _off_pick(main_runs: list[Run], rates: dict[str, float]) -> list[Run]:
    """Runs of a searched method at a rate other than its pick."""
    return [
        run
        for run in main_runs
        if run.results["method"] in rates
        and float(run.results["config"]["lr"]) != rates[run.results["method"]]
    ]
