"""The "What we found" table at the top of docs/results.md: one line per claim of the two papers,
its verdict here and what was measured beside the paper's number.

The lines are read from the sections' own verdicts, so the summary and the sections cannot
disagree; the two claims no section judges (exact consensus on every topology, and the bytes
saved) are judged here from the same results files.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from seedflood.report import present_runs

CLAIMS = (  # (section heading, the paper's claim as its notes state it)
    ("## 1.", "SeedFlood reaches 94–96% of DSGD and beats DZSGD, DZSGD-LoRA and ChocoSGD(-LoRA)"),
    ("## 1b.", "The same at the papers' horizon: 1,000 zeroth-order against 100 first-order steps"),
    ("## 1c.", "The same on RTE and BoolQ's full training sets: 300 against 30 steps"),
    ("## 2.", "SeedFlood keeps its accuracy from 16 to 128 clients (100.2%); gossip degrades"),
    ("## 3.", "SubCGE: rank below 32 or a short refresh period hurts"),
    ("## 4.", "Flooding 4–8 hops a round loses nothing; 1–2 hops hurt"),
    ("## 5.", "SubCGE applies messages far cheaper than regenerating dense directions"),
    ("## 6.", "GWTF: up to 45% less time and 30% more throughput than SWARM under churn"),
    ("## 6b.", "GWTF: up to 50% better than SWARM with heterogeneous communication"),
    ("## 6c.", "GWTF's decentralized flow is near-optimal against a centralized scheme"),
    ("## 6d.", "GWTF recovers a crash mid-backward without costly recomputation"),
)
VERDICT = re.compile(r"^\*\*Verdict: (?P<word>[^*]+?)\.?\*\*(?P<rest>.*)$")
# a short grid's verdict gives way to its grid's at the papers' horizon once that one is decided
HORIZON_VERDICT = re.compile(
    r"^\*\*Verdict at the papers' horizon: (?P<word>[^*]+?)\.?\*\*(?P<rest>.*)$"
)
UNDECIDED = "not yet decided"
RATIOS = re.compile(r"carried (?P<low>[\d.]+×10\S+) to (?P<high>[\d.]+×10\S+) times")
SUPERSCRIPTS = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
LONGEST = 320  # characters of a finding kept in the table; the section has the rest


def _number(power: str) -> float:
    """1.7×10² (as the document writes ratios) as a float."""
    mantissa, exponent = power.split("×10")
    return float(mantissa) * 10 ** int(exponent.translate(SUPERSCRIPTS))


def _shortened(text: str) -> str:
    return text if len(text) <= LONGEST else text[:LONGEST].rsplit(" ", 1)[0] + " …"


def _finding(rest: str) -> str:
    """The verdict's first sentence, without its criterion in parentheses."""
    text = rest.strip()
    if text.startswith("("):
        text = text[text.find("):") + 2 :] if "):" in text else text
    return _shortened(text.lstrip(": ").split(". ")[0].rstrip("."))


def _section_verdicts(lines: list[str]) -> dict[str, tuple[str, str]]:
    """Each section heading's verdict, its word and its first statement: the first at the
    papers' horizon that is decided, else the section's first, led by what its undecided grid
    at the horizon has shown so far."""
    found: dict[str, tuple[str, str]] = {}
    at_horizon: dict[str, tuple[str, str]] = {}
    so_far: dict[str, str] = {}
    heading = ""
    for line in lines:
        if line.startswith("## "):
            heading = line
        elif heading not in found and (match := VERDICT.match(line)):
            found[heading] = (match["word"], _finding(match["rest"]))
        elif heading not in at_horizon and (match := HORIZON_VERDICT.match(line)):
            if match["word"] != UNDECIDED:
                finding = _finding(match["rest"])
                at_horizon[heading] = (match["word"], f"at the papers' horizon: {finding}")
            elif " So far: " in line:
                so_far[heading] = line.split(" So far: ", 1)[1].rstrip(".")
    for heading, shown in so_far.items():
        lead = f"at the papers' horizon, not yet decided, so far: {shown}"
        if heading in found:
            word, finding = found[heading]
            found[heading] = (word, _shortened(f"{lead}; the short grid: {finding}"))
        else:
            found[heading] = (UNDECIDED, _shortened(lead))
    return found | at_horizon


def consensus(root: Path) -> tuple[str, str] | None:
    """The claim that SeedFlood's clients agree exactly on any topology: ring and meshgrid runs
    of one grid, task and seed (hops = diameter) must end on one state hash. Pairs made on different
    devices round differently, so they are counted apart, not against the claim."""
    hashes: dict[tuple[str, str, int], dict[str, tuple[str, str]]] = defaultdict(dict)
    for directory in sorted((root / "results").glob("paper-main-*")):
        for run in present_runs(directory):
            results = run.results
            if results["method"] != "seedflood" or "state_hash" not in results:
                continue
            key = (directory.name, results["config"]["task"], results["config"]["seed"])
            hashes[key][results["topology"]] = (results["state_hash"], results.get("device", "cpu"))
    pairs = [by for by in hashes.values() if {"ring", "meshgrid"} <= by.keys()]
    same_device = [p for p in pairs if p["ring"][1] == p["meshgrid"][1]]
    if not same_device:
        return None
    equal = sum(p["ring"][0] == p["meshgrid"][0] for p in same_device)
    word = "reproduced" if equal == len(same_device) else "not"
    across = len(pairs) - len(same_device)
    return word, (
        f"ring and meshgrid runs of one task and seed end on one state hash in {equal} of "
        f"{len(same_device)} pairs made on one device"
        + (f" ({across} pairs ran on two devices, which round differently)" if across else "")
    )


def what_we_found(lines: list[str], root: Path) -> list[str]:
    """The summary table, from the document's sections (``lines``) and the results under
    ``root``."""
    verdicts = _section_verdicts(lines)
    rows = []
    for prefix, claim in CLAIMS:
        heading = next((h for h in verdicts if h.startswith(prefix)), None)
        word, finding = verdicts[heading] if heading else ("not yet run", "–")
        anchor = f"§{prefix[3:-1]}"
        rows.append(f"| {claim} ({anchor}) | {word} | {finding} |")
    agreed = consensus(root)
    if agreed is not None:
        rows.append(
            f"| SeedFlood's clients hold one model on any topology (§1) | {agreed[0]} "
            f"| {agreed[1]} |"
        )
    bytes_line = next((line for line in lines if line.startswith("Bytes: every other")), None)
    if bytes_line is not None and (match := RATIOS.search(bytes_line)):
        word = "reproduced" if _number(match["low"]) >= 100 else "partly"
        rows.append(
            "| SeedFlood sends 10²–10⁷ times fewer bytes than the other methods (§1) | "
            f"{word} | {bytes_line.removeprefix('Bytes: ').split(' (paper')[0]} |"
        )
    return [
        "## What we found",
        "",
        "One line per claim: the verdict of its section (criteria and intervals there) and "
        "what was measured. Most runs are far shorter than the papers' (each section's setting "
        "says how much), so a verdict speaks for this scale only.",
        "",
        "| the paper's claim | verdict here | what was measured |",
        "|---|---|---|",
        *rows,
        "",
    ]
