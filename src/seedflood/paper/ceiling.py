"""Whether the model can learn a task at all (configs/paper/ceiling-long.yaml): centralized
first-order SGD with several times DSGD's sequential steps. A main-table cell whose DSGD did not
learn cannot test the papers' claims; this section says whether more compute would change that, or
whether the task is beyond this model here, so the claim is held back for a stated reason."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from seedflood.paper.bench import pct, rel
from seedflood.paper.grids import missing_runs, unfinished
from seedflood.paper.verdicts import TO_BEAT, learned
from seedflood.report import Run, present_runs

GRID, OUT = "ceiling-long.yaml", "results/paper-ceiling-long"
DSGD_STEPS = 30  # the first-order steps of configs/paper/main-{rte,boolq}-long.yaml


class Ceiling(NamedTuple):
    """The ceiling grid as it stands, read once for the section, the verdict and the grids whose
    runs it makes moot."""

    runs: list[Run]
    pending: list[str]  # what the grid still lacks, as ``unfinished`` says it
    unsettled: set[str]  # the tasks with a rate still to run


def read_ceiling(root: Path) -> Ceiling:
    unsettled = {run.config.task for run in missing_runs(root, GRID, OUT)}
    return Ceiling(present_runs(root / OUT), unfinished(root, GRID, OUT), unsettled)


def ceiling_lines(root: Path, ceiling: Ceiling) -> list[str]:
    lines = [
        "Can this model learn these tasks from 1,024 examples at all? Centralized first-order "
        "SGD (two clients averaged exactly after every step, batches of 16), more sequential "
        f"steps than DSGD's {DSGD_STEPS} (configs/paper/{GRID}; its header gives the plan):",
        "",
    ]
    runs = ceiling.runs
    if not runs:
        return [*lines, *ceiling.pending]
    lines += [
        "| task | lr | steps | best validation (%) | test accuracy (%) | to beat (%) | wall s "
        "| source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        r = run.results
        task = run.group[1]
        mark = "" if learned(r["accuracy"], run.floor) else ", did not learn"
        trained = [row["accuracy"] for row in run.history if "train_loss" in row]
        validation = pct(max(trained)) if trained else "–"
        lines.append(
            f"| {task} | {r['config']['lr']:g} | {r['steps']} | {validation} "
            f"| {pct(r['accuracy'])}{mark} | {pct(run.floor)} | {r['wall_seconds']:.0f} "
            f"| `{rel(run.directory, root)}` |"
        )
    lines += ["", f"To beat: {TO_BEAT}.", ""]
    lines += [_reading(task, task_runs) for task, task_runs in _by_task(runs).items()]
    return [*lines, "", *ceiling.pending]


def held_back(ceiling: Ceiling) -> tuple[str, list[str]]:
    """The tasks whose claims this model cannot test: those the ceiling runs did not learn at
    any rate tried, with the sentence that says so ("" while none is known). A task is named
    only once every rate of the grid has run for it: before, not learning at one rate is a
    reason to hold its claim back, not yet a verdict."""
    beyond, tasks = [], []
    for task, task_runs in _by_task(ceiling.runs).items():
        best = _best(task_runs)
        if not learned(best.results["accuracy"], best.floor):
            tasks += [] if task in ceiling.unsettled else [task]
            beyond.append(
                f"{task} (best {pct(best.results['accuracy'])}% against {pct(best.floor)}% "
                f"with {best.results['steps']} steps)"
            )
    if not beyond:
        return "", []
    them = "them" if len(beyond) > 1 else "it"
    sentence = (
        f"Held back on {', '.join(beyond)}: centralized SGD with more steps did not learn {them} "
        "either at the rates tried, so with this model the claim cannot be tested there."
    )
    return sentence, tasks


def _by_task(runs: list[Run]) -> dict[str, list[Run]]:
    by_task: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_task[run.group[1]].append(run)
    return dict(sorted(by_task.items()))


def _best(runs: list[Run]) -> Run:
    return max(runs, key=lambda run: run.results["accuracy"] - run.floor)


def _reading(task: str, runs: list[Run]) -> str:
    """One task's answer from its best run: learned, or not at any rate tried so far."""
    best = _best(runs)
    accuracy, floor = best.results["accuracy"], best.floor
    rates = ", ".join(f"{run.results['config']['lr']:g}" for run in runs)
    if learned(accuracy, floor):
        return (
            f"- {task}: learnable here ({pct(accuracy)}% against {pct(floor)}% at lr "
            f"{best.results['config']['lr']:g}): its at-length cells lack steps, not capacity."
        )
    return (
        f"- {task}: not learned at lr {rates} (best {pct(accuracy)}% against {pct(floor)}%): "
        f"with {best.results['steps']} sequential steps against DSGD's {DSGD_STEPS} the model "
        "still does not learn it at the rates tried."
    )
