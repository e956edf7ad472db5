"""The SST-2 comparison at the papers' horizon (configs/paper/main-sst2-long.yaml), apart from the
short main table: its runs take 33 times the steps of the short grid's, and pooling a 1,000-step
seed with 30-step seeds of the same method and topology would make a mean of two regimes.

Runs stopped before their end (a lent GPU's 15 minutes run out) leave a history and no results;
their last evaluation is shown as what it is, since a first-order method that has collapsed to
one answer by its 25th step says something about its learning rate the finished grid will need.
"""

from __future__ import annotations

from pathlib import Path

from seedflood.files import read_jsonl
from seedflood.paper.bench import pct, rel
from seedflood.paper.grids import not_yet_run, unfinished
from seedflood.paper.tuning import horizon_tuning_section
from seedflood.report import present_runs

GRID, OUT = "main-sst2-long.yaml", "results/paper-main-sst2-long"


def horizon_section(root: Path) -> list[str]:
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
        return [*lines, *not_yet_run(GRID, OUT), *search]
    if runs:
        lines += [
            "| method | topology | seed | steps | test accuracy (%) | untrained (%) | device "
            "| wall s | source |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for run in runs:
            r, config = run.results, run.results["config"]
            steps = config["rounds"] * (config.get("local_steps") or 1)
            lines.append(
                f"| {r['method']} | {r['topology']} | {config['seed']} | {steps:,} "
                f"| {pct(r['accuracy'])} | {pct(r['zero_shot_accuracy'])} "
                f"| {r.get('device', 'cpu')} | {r['wall_seconds']:.0f} "
                f"| `{rel(run.directory, root)}` |"
            )
        lines.append("")
    if stopped:
        lines += [
            "Stopped before their end (the lent GPU's time ran out), last evaluation shown:",
            "",
        ]
        lines += [_stopped_line(path, root) for path in stopped]
        lines.append("")
    lines += [
        *search,
        "**Verdict: not yet decided.** The claim needs DSGD and ChocoSGD at 100 first-order "
        "steps on 3 seeds, at rates chosen at this horizon (configs/paper/tune-sst2-long.yaml); "
        "the rates of the short grid do not carry.",
        "",
    ]
    return [*lines, *unfinished(root, GRID, OUT)]


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
