"""What a set of runs was: the values their stored configs share and those that vary, the data
notes they carry, the devices they ran on, and their groups of seeds. Every section of
docs/results.md opens with this, so it lives apart from the sections themselves."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from seedflood.paper.horizon import FULL_FIRST_ORDER
from seedflood.report import Run

SETTING_KEYS = (
    "model", "task", "clients", "topology", "rounds", "local_steps", "batch_size", "lr", "eps",
    "direction", "rank", "refresh", "hops", "n_train", "n_test",
)  # fmt: skip


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = [f"| {' | '.join(header)} |", "|---" * len(header) + "|"]
    return [*lines, *(f"| {' | '.join(str(v) for v in row)} |" for row in rows), ""]


def config_text(value: Any) -> str:
    """A config value as the document shows it: hops None is the diameter."""
    return "diameter" if value is None else str(value)


def natural(value: str) -> tuple[int, str]:
    """A sort key that puts 16 before 128."""
    return len(value), value


def setting_lines(runs: list[Run], root: Path) -> list[str]:
    """The stored configs' values: shared ones in a sentence, the rest per run label."""
    configs = sorted((r.results["config"] for r in runs), key=lambda c: c.get("label", ""))
    varying = [k for k in SETTING_KEYS if len({config_text(c.get(k)) for c in configs}) > 1]
    shared = [f"{k} {config_text(configs[0].get(k))}" for k in SETTING_KEYS if k not in varying]
    seeds = sorted({c["seed"] for c in configs})
    lines = [f"Setting (the runs' stored configs): {', '.join(shared)}; seeds {seeds}.", ""]
    by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for config in configs:
        by_label[config.get("label", "")].append(config)
    if varying:
        lines += table(
            ["run", *varying],
            [
                [label]
                + [
                    "/".join(sorted({config_text(c.get(k)) for c in cs}, key=natural))
                    for k in varying
                ]
                for label, cs in sorted(by_label.items())
            ],
        )
    notes = sorted({portable_note(n) for r in runs for n in r.results.get("data_notes", [])})
    lines += [f"Data note: {note}" for note in notes] + ([""] if notes else [])
    return lines + device_note(runs)


def portable_note(note: str) -> str:
    """A data note with its data directory as the variable that sets it: machines that read the
    same files from different places (a GPU machine's copy) then give one note, not two."""
    return re.sub(
        r"from \S+?/((?:superglue/\w+|sst2)/[\w.]+\.jsonl)", r"from $SEEDFLOOD_DATA_DIR/\1", note
    )


def device_note(runs: list[Run]) -> list[str]:
    """Which runs computed off the CPU ($SEEDFLOOD_DEVICE): the same experiment to rounding, but
    their wall times are another machine's. Full-parameter first-order gossip runs made there
    without a dense mixing operator on record are named as void: on GPUs torch's sparse product
    mixed their states into zeros (docs/performance.md). Runs record their operator since
    2026-12-06, so one made on a GPU after the fix and before then (tune-sst2-long's four ChocoSGD
    runs, which no device note judges) would be named void too: the note errs towards doubt."""
    elsewhere: dict[str, Counter[str]] = defaultdict(Counter)
    suspect = []
    for run in runs:
        device = run.results.get("device", "cpu")
        if device != "cpu":
            elsewhere[device][run.results["config"]["task"]] += 1
            config = run.results["config"]
            full_first_order = config.get("method") in FULL_FIRST_ORDER and not config.get("lora")
            if full_first_order and run.results.get("mixing_operator") != "dense":
                suspect.append(run.directory.name)
    if not elsewhere:
        return []
    parts = [
        f"{sum(counts.values())} on {device} ("
        + ", ".join(f"{task} {n}" for task, n in sorted(counts.items()))
        + ")"
        for device, counts in sorted(elsewhere.items())
    ]
    caution = (
        f" Void: the {len(suspect)} full-parameter DSGD and ChocoSGD runs among them "
        f"({', '.join(sorted(suspect))}). On the GPU torch's sparse product of the mixing matrix "
        "with their wide states returned zeros, so each gossip step zeroed the clients' models "
        "(found on an H200, docs/performance.md; gossip mixes with a dense matrix there since)."
        if suspect
        else ""
    )
    return [
        f"Device: every run on the CPU but {'; '.join(parts)}. A GPU run draws the same batches, "
        "directions and adapters (seedflood.sim.devices) and differs only in rounding; its wall "
        f"time is the GPU's.{caution}",
        "",
    ]


def seed_groups(runs: list[Run]) -> dict[tuple[str, str, str, int], list[Run]]:
    groups: dict[tuple[str, str, str, int], list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.group].append(run)
    return groups
