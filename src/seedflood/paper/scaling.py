"""§2 of docs/results.md: accuracy from 16 to 128 clients as a share of DSGD at 16, for the short
grid (configs/paper/scaling-sst2.yaml) and the one at the papers' horizon (scaling-sst2-long)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from seedflood.paper.bench import link, pct, rel
from seedflood.paper.clients import client_table
from seedflood.paper.grids import not_yet_run, unfinished
from seedflood.paper.horizon import at_length
from seedflood.paper.setting import SETTING_KEYS, config_text, seed_groups, setting_lines
from seedflood.paper.verdicts import interval, learned, scaling_verdict
from seedflood.report import Run, plot_series_log2, present_runs, summarize


def scaling_section(root: Path, out: Path) -> list[str]:
    lines = ["## 2. Scaling: 16 to 128 clients, normalised to DSGD@16", ""]
    runs = present_runs(root / "results" / "paper-scaling")
    if not runs:
        return lines + not_yet_run("scaling-sst2.yaml", "results/paper-scaling")
    body, verdict, _ = _scaling_body(runs, root, out, "results_scaling.png")
    return [
        *lines,
        *body,
        verdict,
        "",
        *unfinished(root, "scaling-sst2.yaml", "results/paper-scaling"),
    ]


def scaling_at_length(root: Path, out: Path) -> list[str]:
    """Scaling at the papers' horizon, read as the short grid is once DSGD@16 has run there; its
    verdict waits for the whole grid, since a curve missing its 128-client point or its seeds
    could not say whether accuracy holds."""
    grid, directory = "scaling-sst2-long.yaml", "results/paper-scaling-long"
    runs = present_runs(root / directory)
    if not any(run.results["method"] == "dsgd" for run in runs):
        return at_length(root, grid, directory)
    body, verdict, normalised = _scaling_body(runs, root, out, "results_scaling_long.png")
    missing = unfinished(root, grid, directory)
    verdict = (
        "**Verdict at the papers' horizon: not yet decided** (it waits for the whole grid; what "
        f"it lacks is listed below).{_so_far(normalised, runs)}"
        if missing
        else verdict.replace("**Verdict:", "**Verdict at the papers' horizon:", 1)
    )
    return [f"### At the papers' horizon: configs/paper/{grid}", "", *body, verdict, "", *missing]


def _so_far(normalised: dict[str, dict[int, float]], runs: list[Run]) -> str:
    """SeedFlood's curve as far as it has run, then the gossip methods' (the claim's other half:
    they degrade), each size with its number of seeds, and a method that has not learned named
    as such (its fall is no degradation): what the summary at the top can say while the grid is
    unfinished."""
    if not normalised.get("seedflood"):
        return ""
    seeds = Counter((r.results["method"], r.results["clients"]) for r in runs)
    not_learned = set(unlearned(runs))

    def curve(method: str) -> str:
        by_size = normalised[method]
        return " → ".join(
            f"{pct(by_size[n])}% at {n} ({seeds[method, n]} seed{'s' * (seeds[method, n] > 1)})"
            for n in sorted(by_size)
        )

    gossip = [
        f"{m} {curve(m)}{' (did not learn)' * (m in not_learned)}"
        for m in sorted(normalised)
        if m not in ("seedflood", "dsgd")
    ]
    rivals = f"; gossip: {'; '.join(gossip)}" if gossip else ""
    return (
        f" So far: SeedFlood {curve('seedflood')} clients of DSGD@16's seed mean (paper: 100.2% "
        f"at 128){rivals}."
    )


Scaled = dict[str, dict[int, float]]
Body = tuple[list[str], str, Scaled]


def _scaling_body(runs: list[Run], root: Path, out: Path, image_name: str) -> Body:
    """A scaling grid's setting, normalised table, plot and sources, its verdict, and each
    method's accuracy by size as a share of DSGD@16."""
    rows, groups = summarize(runs), seed_groups(runs)
    dsgd = [r for r in rows if r["method"] == "dsgd"]
    lines = setting_lines(runs, root)
    if not dsgd:
        return lines, "**Verdict: not yet run.** No DSGD run to normalise to.", {}
    smallest = min(dsgd, key=lambda r: r["clients"])
    reference = dsgd_reference(runs, smallest["clients"], root)
    sizes = sorted({r["clients"] for r in rows})
    lines += [
        f"Accuracy as % of DSGD at {smallest['clients']} clients: the mean of every seed run in "
        f"this setting, {pct(reference['accuracy'])}% ({reference['said']}); paper: SeedFlood "
        "100.2% at 128 on a ring (OPT-125M).",
        "",
        f"| method | {' | '.join(str(n) for n in sizes)} |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    normalised, spread = normalise(rows, reference["accuracy"])
    for method, by_size in sorted(normalised.items()):
        values = [f"{pct(by_size[n])}%" if n in by_size else "–" for n in sizes]
        lines.append(f"| {method} | {' | '.join(values)} |")
    lines += client_table(runs, sizes)
    image = out.parent / "img" / image_name
    image.parent.mkdir(parents=True, exist_ok=True)
    if len(sizes) > 1:
        topologies = "/".join(sorted({r["topology"] for r in rows}))
        share = f"% of DSGD@{smallest['clients']}"
        plot_series_log2(
            _percent(normalised),
            image,
            f"clients ({topologies})",
            f"accuracy, {share}'s seed mean",
            baseline=100,
            errors=_percent(spread),
        )
        lines += ["", f"![accuracy as {share}]({link(image, out)})"]
        if any(any(by_size.values()) for by_size in spread.values()):
            bars = "The bars: 95% t-intervals over the seeds, where a point has more than one."
            lines += ["", bars]
    sources = sorted({rel(m.directory / "results.json", root) for g in groups.values() for m in g})
    lines += ["", "Sources: " + ", ".join(f"`{s}`" for s in sources), ""]
    rounds = {r.results["method"]: r.results["rounds"] for r in runs}
    return lines, scaling_verdict(normalised, rounds, unlearned(runs)), normalised


def normalise(rows: list[dict[str, Any]], reference: float) -> tuple[Scaled, Scaled]:
    """Each method's accuracy by size as a share of ``reference``, and the 95% interval of its
    seeds on that scale: what the table prints and the plot draws, from one place, since the
    plot once divided by DSGD@16's seed 0 while the table divided by its seed mean."""
    shares: Scaled = defaultdict(dict)
    spread: Scaled = defaultdict(dict)
    for r in rows:
        shares[r["method"]][r["clients"]] = r["accuracy"] / reference
        spread[r["method"]][r["clients"]] = interval([a / reference for a in r["accuracies"]])
    return shares, spread


def _percent(scaled: Scaled) -> Scaled:
    return {m: {n: 100 * v for n, v in by_size.items()} for m, by_size in scaled.items()}


def dsgd_reference(runs: list[Run], clients: int, root: Path) -> dict[str, Any]:
    """DSGD at ``clients`` clients, averaged over every seed run in the scaling setting: this
    grid's own runs and the SST-2 main grid's with the same config but the seed. One seed
    chosen alone can be the best of three (78.6% against a mean of 72.7% here)."""

    def setting(run: Run) -> tuple[Any, ...]:
        config = run.results["config"]
        return tuple(config_text(config.get(k)) for k in SETTING_KEYS)

    def dsgd(found: list[Run]) -> list[Run]:
        return [r for r in found if r.results["method"] == "dsgd"]

    own = [r for r in dsgd(runs) if r.results["clients"] == clients]
    wanted = {setting(r) for r in own}
    main = dsgd(present_runs(root / "results" / "paper-main-sst2"))
    by_seed = {r.results["config"]["seed"]: r for r in main if setting(r) in wanted}
    by_seed |= {r.results["config"]["seed"]: r for r in own}
    values = [by_seed[seed].results["accuracy"] for seed in sorted(by_seed)]
    said = f"seeds {sorted(by_seed)}: " + ", ".join(f"{pct(v)}%" for v in values)
    return {"accuracy": fmean(values), "said": said}


def unlearned(runs: list[Run]) -> list[str]:
    """Methods whose every run ended less than LEARNED above its floor (``Run.floor``)."""
    learned_by_method: dict[str, list[bool]] = defaultdict(list)
    for run in runs:
        if run.results.get("zero_shot_accuracy") is not None:
            learned_by_method[run.results["method"]].append(
                learned(run.results["accuracy"], run.floor)
            )
    return sorted(m for m, flags in learned_by_method.items() if not any(flags))
