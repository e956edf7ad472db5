"""Tables and plots from results directories: what a reader looks at instead of logs.

Runs are grouped by (method, task, topology, clients); seeds of one group give mean ± std. Three
plots, each skipped when the runs cannot fill it: accuracy against total bytes per edge on a log
axis (the paper's Figure 1 shape), accuracy normalised to DSGD at the smallest client count against
clients (Table 2's shape), and validation accuracy over training steps and wall time per method.
A single simulated run's report adds its TensorBoard scalars, one panel each.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from seedflood.files import atomic_write_json, atomic_write_text, read_jsonl
from seedflood.protocol.message_log import by_step, read_messages
from seedflood.sim.tracking import plot_board


@dataclass
class Run:
    directory: Path
    results: dict[str, Any]
    history: list[dict[str, Any]]

    @property
    def group(self) -> tuple[str, str, str, int]:
        r = self.results
        return (r["method"], r.get("task", r["config"]["task"]), r["topology"], r["clients"])

    @property
    def floor(self) -> float:
        """What a run must beat to have learned: its untrained model, or always answering the
        test set's most common label where the run recorded that rate."""
        r = self.results
        return max(r["zero_shot_accuracy"], r.get("majority_accuracy", 0.0))


def find_runs(directories: list[Path]) -> list[Run]:
    runs = []
    for directory in directories:
        if not directory.exists():
            raise ValueError(f"no such results directory: {directory}")
        for path in sorted(directory.rglob("results.json")):
            history_file = path.parent / "history.jsonl"
            history = read_jsonl(history_file) if history_file.is_file() else []
            results = json.loads(path.read_text())
            if results.get("kind") == "peer":
                continue  # one peer of a launched run; the run's merged results stand for it
            runs.append(Run(path.parent, results, history))
    if not runs:
        raise ValueError(f"no results.json under {', '.join(map(str, directories))}")
    return runs


def present_runs(directory: Path) -> list[Run]:
    """The runs under ``directory``, or none when it holds no results yet (where ``find_runs``
    raises): for readers that show whatever part of a grid has finished."""
    return find_runs([directory]) if any(directory.rglob("results.json")) else []


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def percent_spread(mean: float, std: float, seeds: int) -> str:
    """Mean ± std in percent; one seed has no spread, so it shows the value alone rather than a
    "± 0.0" that would read as a measured zero."""
    return f"{100 * mean:.1f} ± {100 * std:.1f}" if seeds > 1 else f"{100 * mean:.1f}"


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    """One row per group, in a stable order."""
    groups: dict[tuple[str, str, str, int], list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.group].append(run)
    rows = []
    for (method, task, topology, clients), members in sorted(groups.items()):
        accuracy, accuracy_std = mean_std([m.results["accuracy"] for m in members])
        rows.append(
            {
                "method": method,
                "task": task,
                "topology": topology,
                "clients": clients,
                "seeds": len(members),
                "accuracy": accuracy,
                "accuracy_std": accuracy_std,
                "accuracies": [m.results["accuracy"] for m in members],
                "zero_shot": statistics.fmean(m.results["zero_shot_accuracy"] for m in members),
                "floor": statistics.fmean(m.floor for m in members),
                "bytes_per_edge": statistics.fmean(
                    m.results["bytes_per_edge_max"] for m in members
                ),
                "steps": members[0].results["steps"],
                "wall_seconds": statistics.fmean(m.results["wall_seconds"] for m in members),
                "train_seconds": statistics.fmean(m.results["train_seconds"] for m in members),
            }
        )
    return rows


def format_bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _plot_accuracy_vs_bytes(rows: list[dict[str, Any]], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(9, 4.2))
    for row in rows:
        marker = "*" if row["method"].startswith("seedflood") else "o"
        axis.errorbar(
            max(row["bytes_per_edge"], 1.0),
            100 * row["accuracy"],
            yerr=100 * row["accuracy_std"],
            marker=marker,
            markersize=14 if marker == "*" else 8,
            capsize=3,
            label=f"{row['method']} ({row['topology']}, {row['clients']})",
        )
    if len({row["task"] for row in rows}) == 1:  # the line a method must clear to have learned
        axis.axhline(
            100 * max(row["floor"] for row in rows),
            color="grey",
            linestyle="--",
            linewidth=1,
            label="to beat: untrained model or majority answer",
        )
    axis.set_xscale("log")
    axis.set_xlabel("total bytes per edge (log scale)")
    axis.set_ylabel("test accuracy (%)")
    axis.set_title("Accuracy vs communication")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # off the points
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_series_log2(
    series: dict[str, dict[int, float]],
    path: Path,
    xlabel: str,
    ylabel: str,
    baseline: float | None = None,
    errors: dict[str, dict[int, float]] | None = None,
) -> None:
    """One line per name over x values that double (clients, ranks), ticks at the values run,
    a grey line at ``baseline`` (the value the others are read against), and error bars of
    ``errors``' half-widths where it has them (a point from one seed has none)."""
    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    if baseline is not None:
        axis.axhline(baseline, color="grey", linewidth=0.8)
    for name, points in sorted(series.items()):
        xs = sorted(points)
        spread = (errors or {}).get(name, {})
        axis.errorbar(
            xs,
            [points[x] for x in xs],
            yerr=[spread.get(x, 0.0) for x in xs],
            marker="o",
            capsize=3,
            label=name,
        )
    axis.set_xscale("log", base=2)
    ticks = sorted({x for points in series.values() for x in points})
    axis.set_xticks(ticks, [str(x) for x in ticks], minor=False)
    axis.minorticks_off()
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_scaling(rows: list[dict[str, Any]], path: Path) -> bool:
    dsgd = [r for r in rows if r["method"] == "dsgd"]
    if len({r["clients"] for r in rows}) < 2 or not dsgd:
        return False
    reference = min(dsgd, key=lambda r: r["clients"])["accuracy"]
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in rows:
        series[f"{row['method']} ({row['topology']})"][row["clients"]] = (
            100 * row["accuracy"] / reference
        )
    plot_series_log2(
        series, path, "clients", "accuracy, % of DSGD at the fewest clients", baseline=100
    )
    return True


def _plot_curves(runs: list[Run], path: Path) -> bool:
    """One curve per group, from its first run with a history; False, and no file, where no run
    has one (results.json copied without its history.jsonl)."""
    with_history = [run for run in runs if run.history]
    if not with_history:
        return False
    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    seen: set[tuple[str, str, str, int]] = set()
    for run in sorted(with_history, key=lambda r: r.group):
        if run.group in seen:
            continue
        seen.add(run.group)
        steps_per_round = run.results["steps"] / run.results["rounds"]
        label = f"{run.results['method']} ({run.results['topology']}, {run.results['clients']})"
        accuracy = [100 * h["accuracy"] for h in run.history]
        by_step.plot([h["round"] * steps_per_round for h in run.history], accuracy, label=label)
        by_time.plot([h["train_seconds"] for h in run.history], accuracy, label=label)
    by_step.set_xlabel("local steps per client")
    by_time.set_xlabel("training seconds, all clients simulated on this machine")
    by_step.set_ylabel("validation accuracy (%)")
    by_step.legend(fontsize=7)
    for axis in (by_step, by_time):
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def _latest(history: list[dict[str, Any]], key: str, limit: float) -> dict[str, Any]:
    """The last evaluation at or before ``limit`` of ``key`` (rounds or training seconds)."""
    return [h for h in history if h[key] <= limit + 1e-9][-1]


def head_to_head(runs: list[Run]) -> list[dict[str, Any]]:
    """Each baseline run against the SeedFlood run of the same task, topology, clients and seed:
    SeedFlood's validation accuracy after as many rounds, and after as much training time, as the
    baseline's whole run, and how many times more bytes the baseline sent."""
    seedflood = {
        (r.group[1:], r.results["config"]["seed"]): r
        for r in runs
        if r.results["method"] == "seedflood" and r.history
    }
    rows = []
    for run in runs:
        partner = seedflood.get((run.group[1:], run.results["config"].get("seed")))
        if partner is None or run is partner or not run.history:
            continue
        final = run.history[-1]
        rows.append(
            {
                "method": run.results["method"],
                "rounds": final["round"],
                "train_seconds": final["train_seconds"],
                "accuracy": final["accuracy"],
                "seedflood_equal_rounds": _latest(partner.history, "round", final["round"])[
                    "accuracy"
                ],
                "seedflood_equal_time": _latest(
                    partner.history, "train_seconds", final["train_seconds"]
                )["accuracy"],
                "seedflood_final": partner.history[-1]["accuracy"],
                "bytes_ratio": run.results["bytes_per_edge_max"]
                / partner.results["bytes_per_edge_max"],
            }
        )
    return rows


def _head_to_head_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "## SeedFlood against each baseline",
        "",
        "Validation accuracy (%) at the baseline's last evaluation, and SeedFlood's at its last "
        "evaluation with at most as many rounds and at most as much training time; bytes ratio "
        "= the baseline's bytes per edge over SeedFlood's.",
        "",
        "| baseline | rounds | training s | baseline | SeedFlood, equal rounds "
        "| SeedFlood, equal time | SeedFlood, end | bytes ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['rounds']} | {r['train_seconds']:.0f} "
            f"| {100 * r['accuracy']:.1f} | {100 * r['seedflood_equal_rounds']:.1f} "
            f"| {100 * r['seedflood_equal_time']:.1f} | {100 * r['seedflood_final']:.1f} "
            f"| {r['bytes_ratio']:,.0f}× |"
        )
    return [*lines, ""]


def write_report(directories: list[Path], out: Path) -> Path:
    """Write report.md and its plots into ``out``; returns the report's path."""
    runs = find_runs([Path(d) for d in directories])
    rows = summarize(runs)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Results",
        "",
        f"{len(runs)} runs from {', '.join(str(d) for d in directories)}. Accuracy is the test "
        "accuracy of the average of all clients' models, mean ± std over seeds; bytes are the "
        "total over the busiest edge, both directions added.",
        "",
        "| method | task | topology | clients | seeds | steps | accuracy (%) | zero-shot (%) "
        "| bytes per edge | training time (s) | wall time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['task']} | {r['topology']} | {r['clients']} | {r['seeds']} "
            f"| {r['steps']} | {percent_spread(r['accuracy'], r['accuracy_std'], r['seeds'])} "
            f"| {100 * r['zero_shot']:.1f} | {format_bytes(r['bytes_per_edge'])} "
            f"| {r['train_seconds']:.0f} | {r['wall_seconds']:.0f} |"
        )
    _plot_accuracy_vs_bytes(rows, out / "accuracy_vs_bytes.png")
    lines += ["", "![accuracy vs bytes per edge](accuracy_vs_bytes.png)", ""]
    if plot_scaling(rows, out / "scaling.png"):
        lines += ["![accuracy normalised to DSGD at the fewest clients](scaling.png)", ""]
    if _plot_curves(runs, out / "curves.png"):
        lines += ["![validation accuracy over steps and wall time](curves.png)", ""]
    lines += _head_to_head_lines(head_to_head(runs))
    if len(directories) == 1:
        lines += _board_lines(Path(directories[0]), out)
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines))
    atomic_write_json(out / "summary.json", rows)
    return report


def in_progress(directory: Path) -> bool:
    """A run directory with evaluations written and no results.json yet."""
    return (directory / "history.jsonl").is_file() and not (directory / "results.json").exists()


def write_progress_report(run_dir: Path, out: Path) -> Path:
    """A run still in progress (history.jsonl, no results.json yet): its learning curve so far
    and, for SeedFlood, every committed step's mean |scalar| read from its ledger, the quantity
    the divergence guard watches. Returns the report's path."""
    history = read_jsonl(run_dir / "history.jsonl")
    evaluated = [h for h in history if h["round"] > 0]
    figure, (accuracy, scalars) = plt.subplots(1, 2, figsize=(11, 4.2))
    accuracy.plot([h["round"] for h in history], [100 * h["accuracy"] for h in history], "o-")
    accuracy.set_xlabel("round")
    accuracy.set_ylabel("validation accuracy (%)")
    log = run_dir / "messages.log"
    means = step_means(log) if log.is_file() else []
    scalars.plot(range(len(means)), means, linewidth=0.6)
    scalars.set_xlabel("step")
    scalars.set_ylabel("mean |scalar| of the step's messages")
    for axis in (accuracy, scalars):
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "progress.png", dpi=120)
    plt.close(figure)
    last = history[-1]
    lines = [
        f"# {run_dir.name}: in progress",
        "",
        f"Round {last['round']}: validation accuracy {100 * last['accuracy']:.1f}% "
        f"(round 0: {100 * history[0]['accuracy']:.1f}%), {last['train_seconds']:.0f} s of "
        f"training, {last['train_seconds'] / max(last['round'], 1):.1f} s per round.",
        "",
        "| round | validation accuracy (%) | train loss | mean \\|scalar\\| | training s |",
        "|---|---|---|---|---|",
        *(
            f"| {h['round']} | {100 * h['accuracy']:.1f} | {h.get('train_loss', 0):.4f} "
            f"| {h.get('mean_abs_scalar', 0):.3f} | {h['train_seconds']:.0f} |"
            for h in evaluated
        ),
        "",
        "![learning curve and mean |scalar| per step](progress.png)",
        "",
        *_board_lines(run_dir, out),
    ]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines))
    return report


def _board_lines(run_dir: Path, out: Path) -> list[str]:
    """The run's TensorBoard scalars plotted in ``out``, where it wrote event files."""
    if not plot_board(run_dir, out / "tensorboard.png"):
        return []
    return ["![the run's TensorBoard scalars by round](tensorboard.png)", ""]


def step_means(log: Path) -> list[float]:
    """Each committed step's mean |scalar|, read from a run's message log."""
    messages = read_messages(log)
    return [sum(abs(m.scalar) for m in ms) / len(ms) for _, ms in by_step(messages)]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: benchmarks print the rows the docs quote, so the two cannot drift."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
