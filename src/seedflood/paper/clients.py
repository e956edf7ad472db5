"""What the clients of a decentralized run hold, beside the averaged model the papers score.

The SeedFlood paper reports GMP, the accuracy of the average of all client models, which no
client holds in a decentralized run; an operator gets one client's model. SeedFlood's clients are
identical, gossip clients are not; this table shows how far apart they are at each ring size.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any

from seedflood.paper.bench import pct
from seedflood.report import Run


def client_table(runs: list[Run], sizes: list[int]) -> list[str]:
    """Per method and client count, and a sentence on the gap: the papers' claim that gossip
    degrades with the ring rests on this disagreement, which GMP alone can hide."""
    cells: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        cells[run.results["method"]][run.results["clients"]].append(run.results)
    lines = [
        "",
        "What the clients hold: mean test accuracy (%) of the clients' own models (the "
        "`eval_clients` evaluated per run; all of them where the models are identical) / "
        "consensus distance (1/n)Σ‖x_i − x̄‖² of the trained parameters (the adapters for LoRA).",
        "",
        f"| method | {' | '.join(str(n) for n in sizes)} |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    for method, by_size in sorted(cells.items()):
        values = [
            f"{pct(_mean(by_size[n], 'client_accuracy_mean'))} / "
            f"{_mean(by_size[n], 'consensus_distance'):.3g}"
            if n in by_size
            else "–"
            for n in sizes
        ]
        lines.append(f"| {method} | {' | '.join(values)} |")
    gossip = {m: by_size for m, by_size in cells.items() if m != "seedflood"}
    gaps = [
        fmean(r["client_accuracy_mean"] - r["accuracy"] for r in members)
        for by_size in gossip.values()
        for members in by_size.values()
    ]
    if not gaps:
        return lines
    trends = [
        f"{method} {pct(_mean(by_size[lo], 'client_accuracy_mean'))}% → "
        f"{pct(_mean(by_size[hi], 'client_accuracy_mean'))}% own accuracy, distance "
        f"{_mean(by_size[lo], 'consensus_distance'):.3g} → "
        f"{_mean(by_size[hi], 'consensus_distance'):.3g} ({lo} → {hi} clients)"
        for method, by_size in sorted(gossip.items())
        if len(by_size) > 1
        for lo, hi in [(min(by_size), max(by_size))]
    ]
    spread = f"{100 * min(gaps):+.1f}"
    if max(gaps) != min(gaps):
        spread += f" to {100 * max(gaps):+.1f}"
    return [
        *lines,
        "",
        f"The gossip clients evaluated score {spread} "
        "points against their averaged model (client minus average), a model none of them "
        "holds; every SeedFlood client holds the model scored. From the fewest clients to the "
        f"most: {'; '.join(trends) or 'no gossip method ran at two sizes'}.",
    ]


def _mean(results: list[dict[str, Any]], key: str) -> float:
    return fmean(r[key] for r in results)
