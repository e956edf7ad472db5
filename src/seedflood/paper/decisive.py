"""The decisive cells of the SubCGE and hops grids at the papers' horizon, read seed by seed.

configs/paper/subcge-long.yaml and hops-long.yaml run only the cells that decide a claim: a
setting the paper says hurts against the one it says is best, on the same seeds. A seed fixes
the data order and the draws of both cells, so the effect is read from per-seed differences
(a paired Student-t interval); seeds differ by a few points here, which would swamp a
difference of two means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from seedflood.paper.bench import pct
from seedflood.paper.verdicts import interval
from seedflood.report import Run

SEEDS = 3  # the long grids' seeds: a verdict waits for all of them


@dataclass(frozen=True)
class Pair:
    """A setting the paper says hurts (``worse``) against the one it says is best (``better``),
    each given by the config values that select its runs."""

    label: str
    worse: Mapping[str, Any]
    better: Mapping[str, Any]


NEVER = 1000  # the defaults' refresh period, above the 300 steps of a long run: never refreshed
SUBCGE_PAIRS = (
    Pair("rank 16 against rank 32, T never", {"rank": 16, "refresh": NEVER},
         {"rank": 32, "refresh": NEVER}),
    Pair("T = 3 steps (1%) against T never, rank 32", {"rank": 32, "refresh": 3},
         {"rank": 32, "refresh": NEVER}),
)  # fmt: skip
SUBCGE_CLAIM = "the paper's rank below 32 and short refresh period each hurt"
HOPS_PAIRS = (Pair("k = 2 against k = diameter", {"hops": 2}, {"hops": None}),)
HOPS_CLAIM = "the paper's k = 2 hurts"


def _cell(runs: Sequence[Run], wanted: Mapping[str, Any]) -> dict[int, float]:
    """Test accuracy by seed of the runs whose config has every value in ``wanted``."""
    return {
        run.results["config"]["seed"]: run.results["accuracy"]
        for run in runs
        if all(run.results["config"].get(key) == value for key, value in wanted.items())
    }


def _reading(differences: list[float]) -> str:
    if len(differences) < 2:
        return "undecided: fewer than 2 seeds"
    mean, half = fmean(differences), interval(differences)
    if mean + half < 0:
        return "hurts"
    return "helps" if mean - half > 0 else "not told apart"


def decisive_lines(runs: Sequence[Run], pairs: Sequence[Pair], claim: str) -> list[str]:
    """A table of each pair's per-seed difference and the verdict on ``claim`` (that every
    pair's first setting hurts): reproduced when all do, not when none does."""
    lines = [
        "Decisive cells, seed by seed (difference: the first setting's test accuracy minus the "
        "second's on the seeds both ran, mean ± its 95% paired t-interval; and on how many of "
        "those seeds the first was lower, a sign that no interval needs):",
        "",
        "| comparison | seeds | first (%) | second (%) | difference (points) | first lower on "
        "| reading |",
        "|---|---|---|---|---|---|---|",
    ]
    findings, readings, complete = [], [], True
    for pair in pairs:
        worse, better = _cell(runs, pair.worse), _cell(runs, pair.better)
        seeds = sorted(worse.keys() & better.keys())
        complete &= len(seeds) >= SEEDS
        if not seeds:
            lines.append(f"| {pair.label} | 0 | – | – | – | – | not yet run |")
            findings.append(f"{pair.label}: not yet run")
            continue
        differences = [worse[s] - better[s] for s in seeds]
        reading = _reading(differences)
        readings.append(reading)
        shown = f"{100 * fmean(differences):+.1f}"
        if len(differences) > 1:  # one seed has no interval: "± 0.0" would claim a certain one
            shown += f" ± {100 * interval(differences):.1f}"
        seed_word = "seed" if len(seeds) == 1 else "seeds"
        lower = f"{sum(d < 0 for d in differences)} of {len(seeds)}"
        lines.append(
            f"| {pair.label} | {len(seeds)} | {pct(fmean(worse[s] for s in seeds))} "
            f"| {pct(fmean(better[s] for s in seeds))} | {shown} | {lower} | {reading} |"
        )
        findings.append(
            f"{pair.label} {shown} points over {len(seeds)} {seed_word}, lower on {lower} "
            f"({reading})"
        )
    hurt = readings.count("hurts")
    if not complete:
        word = "not yet decided"
    elif hurt == len(pairs):
        word = "reproduced"
    else:
        word = "partly" if hurt else "not"
    criterion = (
        f"{claim}: a setting hurts when its difference's interval lies below zero, over all "
        f"{SEEDS} seeds"
    )
    return [
        *lines,
        "",
        f"**Verdict at the papers' horizon: {word}** ({criterion}): {'; '.join(findings)}.",
        "",
    ]
