"""What of each configs/paper grid has run, for docs/results.md to say beside its numbers.

A section computed from a partial grid reads like a finished one unless it names the gap: a
scaling curve without its 128-client point or a main table with one seed of three. So each
section lists its grid's runs that have no results with that grid's exact config (a run made
under an older config counts as missing, as `seedflood compare` would rerun it) and the command
that completes the grid, skipping what has finished, with the time its finished runs of the same
variant took, so whoever completes the grid can plan the hours. A missing run that is part-way
through, its committed ledger made under the grid's config, says how far it got and its last
validation accuracy: a lane resumes from there, and a reader sees the number it will settle.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from seedflood.config import RunConfig
from seedflood.files import read_jsonl
from seedflood.grid import PlannedRun, plan, same_data
from seedflood.sim.checkpoint import CheckpointError
from seedflood.sim.ledger import last_round
from seedflood.sim.run_ledgers import ledger_origin


def compare_command(grid: str, out: str) -> str:
    return f"seedflood compare configs/paper/{grid} --out {out}"


def not_yet_run(grid: str, out: str) -> list[str]:
    """The whole section when its grid has no results at all."""
    lead = f"**Verdict: not yet run.** No results under `{out}/`. Run:"
    return [lead, "", "```bash", compare_command(grid, out), "```", ""]


def missing_runs(root: Path, grid: str, out: str) -> list[PlannedRun]:
    """The grid's planned runs without results under its exact config and data; none when its
    file is absent (a results tree without its configs)."""
    path = root / "configs" / "paper" / grid
    if not path.is_file():
        return []
    return [run for run in plan(path) if run.finished_results(root / out) is None]


def unfinished(root: Path, grid: str, out: str) -> list[str]:
    """The grid's runs without results, by variant, and the command that runs them; nothing
    when the grid is complete or its file is absent (a results tree without its configs)."""
    path = root / "configs" / "paper" / grid
    if not path.is_file():
        return []
    planned = plan(path)
    missing: dict[str, list[str]] = defaultdict(list)
    minutes: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    other_data = 0  # finished with the grid's config, on the data directory as it was then
    for run in planned:
        variant = run.config.name
        results = run.results_with_config(root / out)
        if results is not None and same_data(results, run.config):
            device = results.get("device", "cpu")
            minutes[variant][device].append(results["wall_seconds"] / 60)
        else:
            other_data += results is not None
            name = run.name.removeprefix(variant).strip("_")
            missing[variant].append(name + so_far(run, root / out))
    if not missing:
        return []
    count = sum(len(names) for names in missing.values())
    lines = [
        f"Not yet run: {count} of the {len(planned)} runs of configs/paper/{grid} "
        f"(`{compare_command(grid, out)}` runs them and skips the finished ones)"
        + (
            f"; {other_data} of them ran with this config on the data directory as it was then "
            "(their data notes say how many examples it held), not on its files as they are now, "
            "so their results above stand for those files only"
            if other_data
            else ""
        )
        + ":",
        "",
    ]
    lines += [
        f"- {variant}{_took(minutes[variant])}: {', '.join(names)}"
        for variant, names in missing.items()
    ]
    return [*lines, ""]


def _took(by_device: dict[str, list[float]]) -> str:
    """How long the variant's finished runs took, per device (the CPU's first: "here")."""
    parts = []
    for device in sorted(by_device, key=lambda d: (d != "cpu", d)):
        minutes = by_device[device]
        low, high = round(min(minutes)), round(max(minutes))
        span = f"{low}" if low == high else f"{low}–{high}"
        each = " each" if len(minutes) > 1 else ""
        where = "here" if device == "cpu" else f"on {device}"
        parts.append(f"{len(minutes)} finished {where} in {span} min{each}")
    return f" ({'; '.join(parts)})" if parts else ""


def in_progress(root: Path, grid: str, out: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """The grid's runs part-way through under its config and data, by directory name, with their
    histories so far (the untrained model's evaluation first), once they have evaluated after it:
    what a plot of a running grid draws beside the finished runs. Nothing when the grid file is
    absent."""
    path = root / "configs" / "paper" / grid
    if not path.is_file():
        return []
    found = []
    for run in plan(path):
        ledger = None if run.finished_results(root / out) else _ledger(run, root / out)
        if ledger is not None and ledger.evaluated:
            found.append((run.name, ledger.history))
    return found


class _Ledger(NamedTuple):
    history: list[dict[str, Any]]
    evaluated: list[dict[str, Any]]  # the evaluations after round 0
    logged: dict[str, Any] | None  # the last round logged whole


def _ledger(run: PlannedRun, out: Path) -> _Ledger | None:
    """A part-way run's committed ledger, where it says it was made under this grid's config and
    data (SeedFlood's manifest, a zeroth-order gossip run's scalar ledger); else None."""
    directory = run.directory(out)
    written, history = ledger_origin(directory), directory / "history.jsonl"
    if written is None or not history.is_file():
        return None
    try:
        stored = RunConfig(**written["config"])
        evaluations = read_jsonl(history)
        evaluated = [h for h in evaluations if h["round"] > 0]
        logged = last_round(directory)
    except (json.JSONDecodeError, KeyError, TypeError, ValidationError, CheckpointError):
        return None
    if stored != run.config or not same_data(written, run.config):
        return None
    return _Ledger(evaluations, evaluated, logged)


def so_far(run: PlannedRun, out: Path) -> str:
    """ " (round R of N so far: validation V%)" for a run part-way through (``_ledger``), else
    ""; R is the last round its ledger logged whole, with the round of V where that is earlier
    (and no V before the first)."""
    ledger = _ledger(run, out)
    if ledger is None:
        return ""
    evaluated, logged = ledger.evaluated, ledger.logged
    if not evaluated:
        done = logged["round"] if logged is not None else 0
        return f" (round {done} of {run.config.rounds} so far)" if done else ""
    last = evaluated[-1]
    accuracy = f"validation {100 * last['accuracy']:.1f}%"
    if logged is not None and logged["round"] > last["round"]:
        return (
            f" (round {logged['round']} of {run.config.rounds} so far: {accuracy} at round "
            f"{last['round']})"
        )
    return f" (round {last['round']} of {run.config.rounds} so far: {accuracy})"
