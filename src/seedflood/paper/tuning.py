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

from seedflood.grid import PlannedRun, plan
from seedflood.paper.bench import pct, rel
from seedflood.paper.grids import so_far
from seedflood.report import Run, present_runs


@dataclass(frozen=True)
class Search:
    """A learning-rate search: its grid file and the directory its runs write. Searches made at
    different horizons are kept apart: a 30-step rate and a 1,000-step rate answer different
    questions, and pooling their points would pick across regimes."""

    grid: str
    out: str


SHORT = Search("configs/paper/tune-sst2.yaml", "results/paper-tune-sst2")
LONG = Search("configs/paper/tune-sst2-long.yaml", "results/paper-tune-sst2-long")


@dataclass(frozen=True)
class GridPoint:
    lr: float
    validation: float
    test: float
    source: str
    stopped_at: int | None = None


def stopped_at(results: dict) -> int | None:
    """The step at which the run's divergence guard stopped it (SeedFlood keeps the model of the
    step before, DZSGD that of the step's round), or None if it ran its course: a rate that
    diverged must say so where it is shown."""
    guard = results.get("guard") or {}
    return int(guard["step"]) if guard.get("action") == "stopped" else None


def _validation_accuracy(run: Run) -> float:
    if not run.history or "accuracy" not in run.history[-1]:
        raise ValueError(f"{run.directory}: no evaluation in history.jsonl to tune on")
    return float(run.history[-1]["accuracy"])


def tuning_grids(root: Path, search: Search = SHORT) -> dict[tuple[str, str], list[GridPoint]]:
    """(task, method) → its grid points by rate, from the search's results directory."""
    grids: dict[tuple[str, str], list[GridPoint]] = defaultdict(list)
    for run in present_runs(root / search.out):
        config = run.results["config"]
        grids[config["task"], run.results["method"]].append(
            GridPoint(
                lr=float(config["lr"]),
                validation=_validation_accuracy(run),
                test=float(run.results["accuracy"]),
                source=rel(run.directory / "results.json", root),
                stopped_at=stopped_at(run.results),
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


def tuned_rates(root: Path, task: str = "sst2", search: Search = SHORT) -> dict[str, float]:
    """method → tuned learning rate for ``task`` (empty when no search has run). The search runs
    on SST-2 and its rates serve every task: a search per task would triple its cost here."""
    return _picks(tuning_grids(root, search), task)


def bracketed(points: list[GridPoint]) -> bool:
    """Whether the pick has a tried rate on each side: a pick at the grid's edge says only that
    the best rate may lie beyond it."""
    chosen = pick(points).lr
    return min(p.lr for p in points) < chosen < max(p.lr for p in points)


def _missing_points(
    root: Path, grids: dict[tuple[str, str], list[GridPoint]], search: Search = SHORT
) -> dict[str, list[PlannedRun]]:
    """method → the search grid's runs with no results yet (empty without the grid file)."""
    grid = root / search.grid
    if not grid.is_file():
        return {}
    done = {(method, p.lr) for (_, method), points in grids.items() for p in points}
    missing: dict[str, list[PlannedRun]] = defaultdict(list)
    for run in plan(grid):
        if (run.config.name, run.config.lr) not in done:
            missing[run.config.name].append(run)
    return dict(missing)


def _not_yet_run(
    root: Path, missing: dict[str, list[PlannedRun]], search: Search = SHORT
) -> list[str]:
    """The missing rates by method, each with how far it got where it is part-way through."""
    if not missing:
        return []
    methods = sorted(missing)
    rates = {
        method: ", ".join(f"{run.config.lr:g}{so_far(run, root / search.out)}" for run in runs)
        for method, runs in missing.items()
    }
    listed = "; ".join(f"{m} at lr {rates[m]}" for m in methods)
    command = f"seedflood compare {search.grid} --out {search.out} --only {','.join(methods)}"
    return [f"Not yet run: {listed} (`{command}` runs them and skips the rest).", ""]


def _grid_rows(grids: dict[tuple[str, str], list[GridPoint]]) -> list[str]:
    """The table of a search: every point, the pick, and whether the points bracket it."""
    lines = [
        "| task | method | grid: lr → validation % (test %) | tuned lr | bracketed | "
        "source of the pick |",
        "|---|---|---|---|---|---|",
    ]
    for (task, method), points in grids.items():
        best = pick(points)
        cells = ", ".join(
            f"{p.lr:g} → {pct(p.validation)} ({pct(p.test)}"
            + (f"; guard stopped it at step {p.stopped_at:,})" if p.stopped_at else ")")
            for p in points
        )
        edge = (
            "yes" if bracketed(points) else "no: one rate" if len(points) == 1 else "no: at an edge"
        )
        row = [task, method, cells, f"**{best.lr:g}**", edge, f"`{best.source}`"]
        lines.append(f"| {' | '.join(row)} |")
    return [*lines, ""]


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
        *_grid_rows(grids),
    ]
    missing = _missing_points(root, grids)
    lines += _not_yet_run(root, missing)
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
    missing: dict[str, list[PlannedRun]],
) -> set[str]:
    """Main-table methods whose search has not run, or not every point of it."""
    searched = {method for _, method in grids} - set(missing)
    return {run.results["method"] for run in main_runs} - searched


def untuned_methods(root: Path, main_runs: list[Run], search: Search = SHORT) -> set[str]:
    """Main-table methods whose rows are not at a searched pick: ``unsearched`` ones, and those
    with a run at a rate other than their search's pick."""
    grids = tuning_grids(root, search)
    off_pick = {run.results["method"] for run in _off_pick(main_runs, _picks(grids, "sst2"))}
    return unsearched(main_runs, grids, _missing_points(root, grids, search)) | off_pick


def _off_pick(main_runs: list[Run], rates: dict[str, float]) -> list[Run]:
    """Runs of a searched method at a rate other than its pick."""
    return [
        run
        for run in main_runs
        if run.results["method"] in rates
        and float(run.results["config"]["lr"]) != rates[run.results["method"]]
    ]


def horizon_tuning_section(root: Path) -> list[str]:
    """Markdown: the search at the papers' horizon (LONG), apart from the short one, with what
    of it has not run; nothing before its first run or without its grid file."""
    grids = tuning_grids(root, LONG)
    if not grids:
        return []
    lines = [
        "### Learning rates at this horizon",
        "",
        f"{LONG.grid}: 4 rates 2× apart per method, 16-client ring, seed 0, the steps of the "
        "runs above, picked on validation (200 examples) at the run's end; a tie goes to the "
        "smaller rate.",
        "",
        *_grid_rows(grids),
    ]
    return [*lines, *_not_yet_run(root, _missing_points(root, grids, LONG), LONG)]
