"""Verdicts on the SeedFlood paper's main-table, scaling and SubCGE claims, from accuracies alone.

Kept apart from the document's layout so that the rule behind each "reproduced", "partly" or
"not" can be read in one place and tested on plain numbers. Each claim is split into the
findings the paper states, each finding is judged on every cell that can test it, and the
sentence names the cells, so a reader can see which part held.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from typing import Any

from scipy import stats

from seedflood.paper.bench import pct

# Differences smaller than this (accuracy, or accuracy as a fraction of DSGD@16) count as equal:
# about one standard error of 500 test examples at 70%, and single-seed cells here.
TOLERANCE = 0.02
# A method whose accuracy never rises this far above the untrained model's, nor above always
# answering the most common label, has not learned in the budget: it is named but not judged.
LEARNED = 0.05
TO_BEAT = (
    "the better of the untrained model and always answering the test set's most common label, "
    f"which a run must pass by {100 * LEARNED:.0f} points to count as learning"
)
PAPER_GOSSIP_ROUNDS = 100  # 500 first-order steps communicating every 5, from its byte counts
# The methods the paper places below SeedFlood: the zeroth-order ones, ChocoSGD-LoRA, and full
# ChocoSGD, which its byte ordering and relative-average table put under SeedFlood too.
RIVALS = ("dzsgd", "dzsgd-lora", "choco-lora", "choco")
SIGNIFICANCE = 0.05  # two-sided Welch's t-test between two methods' seeds


def interval(values: Sequence[float]) -> float:
    """Half-width of the 95% confidence interval of the mean of ``values`` (Student's t with
    n − 1 degrees of freedom); 0 for a single value, which has none."""
    if len(values) < 2:
        return 0.0
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return float(half)


def percent_interval(values: Sequence[float]) -> str:
    """A mean in percent with its 95% interval, or the value alone for one seed."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return pct(mean)
    return f"{pct(mean)} ± {pct(interval(values))}"


def compare(ours: Sequence[float], theirs: Sequence[float]) -> tuple[int, float | None]:
    """Whether ``ours`` is ahead (+1), behind (−1) or not told apart (0) from ``theirs``, and the
    p-value of Welch's t-test on the seeds. With one seed on a side no test exists: the means
    decide and the p-value is None, which the sentence says."""
    difference = statistics.fmean(ours) - statistics.fmean(theirs)
    if len(ours) < 2 or len(theirs) < 2:
        return (difference > 0) - (difference < 0), None
    p = float(stats.ttest_ind(ours, theirs, equal_var=False).pvalue)
    if math.isnan(p):  # no spread on either side: the means are all there is
        return (difference > 0) - (difference < 0), None
    return ((difference > 0) - (difference < 0)) if p < SIGNIFICANCE else 0, p


def against(name: str, ours: Sequence[float], row: dict[str, Any]) -> tuple[int, str]:
    """The comparison with one rival's row, and how the verdict says it."""
    theirs = row.get("accuracies") or [row["accuracy"]]
    order, p = compare(ours, theirs)
    word = {1: "ahead of", -1: "behind", 0: "not told apart from"}[order]
    tested = f"Welch p = {p:.3g}" if p is not None else "one seed, untested"
    means = f"{pct(statistics.fmean(ours))} vs {pct(statistics.fmean(theirs))}%"
    return order, f"{word} {name} ({means}, {tested})"


def learned(accuracy: float, floor: float) -> bool:
    """Whether ``accuracy`` clears ``floor`` (``Run.floor``) by LEARNED."""
    return accuracy - floor >= LEARNED


def _curve(by_size: dict[int, float]) -> str:
    return " → ".join(f"{pct(by_size[n])}% at {n}" for n in sorted(by_size))


def main_verdict(
    rows: Sequence[dict[str, Any]],
    complete: bool,
    fallback: bool,
    untuned: Collection[str] = (),
    planned: str = "3 tasks × ring/meshgrid × 3 seeds",
) -> str:
    """The paper's main-table shape, judged per task and topology: SeedFlood within 94–96% of
    DSGD or above, and ahead of the methods the paper places below it (RIVALS), each comparison
    tested on the seeds (``compare``).

    A cell whose DSGD ends less than LEARNED above its floor (the untrained model, or always
    answering the most common label) is named but not judged: with the reference at chance,
    ratios to it and the order of the methods are noise, and the claim counts as reproduced only
    where every cell could test it. A rival that did not learn is named as such and not counted
    as beaten; rivals in ``untuned`` (rows not at their searched rate) are marked, since beating
    a method at a rate nobody picked says less than beating it tuned."""
    judged, reasons, unlearned, all_ok, any_ok = 0, [], [], True, False
    for task, topology in sorted({(r["task"], r["topology"]) for r in rows}):
        cell = {r["method"]: r for r in rows if (r["task"], r["topology"]) == (task, topology)}
        if "seedflood" not in cell or "dsgd" not in cell:
            continue
        seedflood, dsgd = cell["seedflood"]["accuracy"], cell["dsgd"]["accuracy"]
        if not learned(dsgd, cell["dsgd"]["floor"]):
            unlearned.append(
                f"{task}/{topology} (DSGD {pct(dsgd)}%, SeedFlood {pct(seedflood)}%, to beat "
                f"{pct(cell['dsgd']['floor'])}%)"
            )
            continue
        judged += 1
        ours = cell["seedflood"].get("accuracies") or [seedflood]
        orders, said = [], []
        for method in (m for m in RIVALS if m in cell):
            row = cell[method]
            name = f"{method} (untuned rate)" if method in untuned else method
            if not learned(row["accuracy"], row["floor"]):
                said.append(
                    f"{name} did not learn ({pct(row['accuracy'])}%, to beat "
                    f"{pct(row['floor'])}%), so it is no rival here"
                )
                continue
            order, sentence = against(name, ours, row)
            orders.append(order)
            said.append(sentence)
        ahead = all(order > 0 for order in orders)  # a cell where no rival learned is not lost
        all_ok &= seedflood / dsgd >= 0.94 and ahead
        any_ok |= seedflood / dsgd >= 0.94 or ahead
        reasons.append(
            f"{task}/{topology}: SeedFlood at {pct(seedflood / dsgd)}% of DSGD (paper 94–96%); "
            + ("; ".join(said) or "no rivals ran")
        )
    why = (
        f"DSGD ends less than {100 * LEARNED:.0f} points above the better of the untrained model "
        "and always answering the most common label, so it has not learned that task in this "
        "budget and the ratios to it are noise."
    )
    if not judged and unlearned:
        return (
            f"**Verdict: not tested at this scale.** In every cell run, {'; '.join(unlearned)}, "
            f"{why}"
        )
    not_judged = f" Not judged: {'; '.join(unlearned)}: {why}" if unlearned else ""
    if not judged:
        return "**Verdict: not yet run.** No task and topology has both SeedFlood and DSGD."
    whole = all_ok and complete and not unlearned
    verdict = "reproduced" if whole else "partly" if any_ok or all_ok else "not"
    cells = f"; {judged} of {judged + len(unlearned)} cells could test it" if unlearned else ""
    scope = (
        "the earlier single-setting comparison (one task, topology and seed), not the main grid"
        if fallback
        else f"the full grid{cells}"
        if complete
        else f"an incomplete grid ({planned} planned)"
    )
    criterion = (
        f"ahead or behind means a two-sided Welch's t-test on the seeds at p < {SIGNIFICANCE}"
    )
    return f"**Verdict: {verdict}** ({scope}; {criterion}): {'. '.join(reasons)}.{not_judged}"


def so_far(verdict: str) -> str:
    """A verdict on a grid still running, restated as what its finished runs say: "not yet
    decided", with the judgement and its numbers first, where "What we found" reads them."""
    word, _, rest = verdict.removeprefix("**Verdict: ").partition("**")
    rest = rest.strip()
    if word.rstrip(".") == "not yet run":  # runs exist, none of them a SeedFlood–DSGD cell
        return f"**Verdict: not yet decided.** {rest}"
    if word.endswith("."):  # a whole-sentence verdict goes on as one sentence with its reason
        rest = rest[:1].lower() + rest[1:]
    joint = " " if rest.startswith("(") else ": "
    return (
        f"**Verdict: not yet decided.** So far, on the runs made, {word.rstrip('.')}{joint}{rest}"
    )


def scaling_verdict(
    normalised: dict[str, dict[int, float]],
    rounds: dict[str, int],
    unlearned: Sequence[str] = (),
) -> str:
    """The paper's shape: SeedFlood keeps its accuracy up to 128 clients (100.2% of DSGD@16
    there) while gossip methods lose accuracy as the ring grows. Accuracy at the most clients
    run against the fewest; within TOLERANCE counts as kept. ``unlearned`` methods stayed within
    LEARNED of their floor (``Run.floor``) at every size and are left out of the judgement."""
    curves = {m: s for m, s in normalised.items() if m != "dsgd" and len(s) > 1}
    if not curves:
        return "**Verdict: not yet run.** No method has run at more than one size yet."
    gossip = sorted(m for m in curves if m != "seedflood" and m not in unlearned)
    skipped = sorted(m for m in curves if m in unlearned)
    change = {m: s[max(s)] - s[min(s)] for m, s in curves.items()}
    degrade = [m for m in gossip if change[m] < -TOLERANCE]
    seedflood = curves.get("seedflood", {})
    keeps = bool(seedflood) and change["seedflood"] >= -TOLERANCE
    if keeps and max(seedflood) == 128 and gossip and degrade == gossip:
        verdict = "reproduced"
    else:
        verdict = "partly" if keeps or degrade else "not"
    ours = f"SeedFlood {_curve(seedflood)}" if seedflood else "SeedFlood at one size only"
    listed = "; ".join(f"{m} {_curve(curves[m])}" for m in gossip) or "none at two sizes"
    steady = [m for m in gossip if m not in degrade]
    reason = (
        f" Here {', '.join(steady)} communicated {'/'.join(str(rounds[m]) for m in steady)} times "
        f"against the paper's {PAPER_GOSSIP_ROUNDS}, which leaves disagreement between clients "
        "little time to build up, and more clients average more examples per round."
        if steady
        else ""
    )
    not_judged = (
        f" Not judged: {', '.join(f'{m} {_curve(curves[m])}' for m in skipped)}, never "
        f"{100 * LEARNED:.0f} points above the zero-shot model or the majority answer: "
        "it does not learn in this budget, so its curve is noise."
        if skipped
        else ""
    )
    return (
        f"**Verdict: {verdict}** (a loss of more than {100 * TOLERANCE:.0f} points of DSGD@16 "
        f"counts as degrading): {ours} clients (paper: 100.2% at 128); gossip: {listed}; "
        f"degrading: {', '.join(degrade) or 'none'} of {', '.join(gossip) or 'none'}."
        f"{reason}{not_judged}"
    )


def subcge_verdict(accuracy: dict[tuple[int, int], float]) -> str:
    """The paper's two findings, judged apart: ranks below 32 do worse than every rank of 32 or
    more (at each refresh period that ran both), and the shortest refresh period loses more
    than TOLERANCE to a longer one at the same rank."""
    refreshes = sorted({t for _, t in accuracy})
    rank_cells = []
    for t in refreshes:
        low = [a for (r, period), a in accuracy.items() if period == t and r < 32]
        high = [a for (r, period), a in accuracy.items() if period == t and r >= 32]
        if low and high:
            rank_cells.append((t, max(low), min(high)))
    shortest, longer = refreshes[0], refreshes[1:]
    short_cells = {
        r: (a, max(accuracy[r, t] for t in longer if (r, t) in accuracy))
        for (r, t), a in sorted(accuracy.items())
        if t == shortest and any((r, t) in accuracy for t in longer)
    }
    if not rank_cells and not short_cells:
        return "**Verdict: not yet run.** No rank or refresh comparison has both of its cells."
    rank_hurts = [t for t, low, high in rank_cells if low < high]
    short_hurts = [r for r, (short, best) in short_cells.items() if short < best - TOLERANCE]
    rank_ok = bool(rank_cells) and len(rank_hurts) == len(rank_cells)
    short_ok = bool(short_cells) and len(short_hurts) == len(short_cells)
    verdict = (
        "reproduced" if rank_ok and short_ok else "partly" if rank_hurts or short_hurts else "not"
    )
    periods = "; ".join(
        f"T = {t}: best below 32 {pct(low)}%, worst from 32 {pct(high)}%"
        for t, low, high in rank_cells
    )
    return (
        f"**Verdict: {verdict}**: ranks below 32 under every rank from 32 at {len(rank_hurts)} "
        f"of {len(rank_cells)} refresh periods ({periods or 'none with both'}); T = {shortest} "
        f"loses more than {100 * TOLERANCE:.0f} points to a longer period at rank "
        f"{', '.join(map(str, short_hurts)) or 'none'} of {', '.join(map(str, short_cells))}."
    )


def paired_deltas(by_seed: dict[str, dict[int, float]], reference: str) -> dict[str, float]:
    """Each setting's mean accuracy gain over ``reference`` on the seeds both ran: seeds differ
    by a few points here, so a mean over different seeds would mix seed noise into the effect."""
    if reference not in by_seed:
        return {}
    deltas = {}
    for setting, seeds in by_seed.items():
        shared = sorted(seeds.keys() & by_seed[reference].keys())
        if shared:
            gains = [seeds[s] - by_seed[reference][s] for s in shared]
            deltas[setting] = sum(gains) / len(gains)
    return deltas
