"""docs/results.md's generator on fabricated results (tests/paper/fabricate.py): sections,
numbers, determinism, what we found."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seedflood import grid
from seedflood.grid import plan
from seedflood.paper.document import write_paper_results
from seedflood.paper.findings import consensus
from seedflood.paper.grids import in_progress
from seedflood.paper.setting import device_note, portable_note
from seedflood.report import Run
from seedflood.sim.ledger import LAST_ROUND
from seedflood.sim.scalar_ledger import FORMAT as SCALARS_FORMAT
from seedflood.sim.scalar_ledger import SCALARS
from tests.paper.fabricate import REPO, write_pipeline_runs, write_run

HEADINGS = ("## 1. Main", "## 2. Scaling", "## 3. SubCGE", "## 4. Flooding hops", "## 5.", "## 6.")


def test_every_section_with_the_files_numbers(root: Path) -> None:
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    positions = [text.index(heading) for heading in HEADINGS]
    assert positions == sorted(positions)
    # main: seedflood 0.76/0.74 → 75.0 ± 12.7 (95% interval, t with 1 degree of freedom),
    # 0.75 / 0.80 = 93.8% of DSGD, 3.84 KB per edge
    assert (
        "| seedflood | sst2 | ring | 16 | 2 | 30 | 75.0 ± 12.7 | 75.0 | 49.6 | 93.8% | 94–96% "
        "| 3.84 KB |" in text
    )
    assert (
        "| dsgd | sst2 | ring | 16 | 2 | 30 | 80.0 ± 12.7 | 60.0 | 49.6 | 100.0% | 100% |" in text
    )
    assert (
        "`results/paper-main-sst2/runs/seedflood_topology-ring_clients-16_seed-1/results.json`"
        in text
    )
    assert "**Verdict: partly** (an incomplete grid" in text
    # bytes: 3.2e9 against SeedFlood's 3,840 on every edge
    assert "carried 8.3×10⁵ to 8.3×10⁵ times SeedFlood's in the same task and topology" in text
    assert "seedflood compare configs/paper/main-boolq.yaml --out results/paper-main-boolq" in text
    assert "compare-sst2-ring16" not in text  # the fallback only stands in when no main grid ran
    # bytes: the bench's number and the codec's agree
    assert "| 5 | fp32 | 399,584 | 4.99 | 399,584 | 400,000 (~400 KB) |" in text
    # absent sections name their command
    assert "seedflood compare configs/paper/scaling-sst2.yaml --out results/paper-scaling" in text
    assert "seedflood compare configs/paper/subcge-ablation.yaml --out results/paper-subcge" in text
    assert (
        "seedflood compare configs/paper/main-sst2-long.yaml --out results/paper-main-sst2-long"
        in text
    )
    assert text.count("**Verdict: not yet run.**") == 3
    # hops: 71.0 is within 2 points of 72.0; 55.6 is not; k = 2 and 8 are missing
    assert "| 1 | 1 | 55.0 | -17.0 | 3.84 KB |" in text
    assert "| 4 | 1 | 71.0 | -1.0 |" in text
    assert "| 8 | 0 | not yet run |" in text
    assert "no loss at k = 4; loss at k = 1; not yet run: k = 2, 8." in text
    # apply cost: dense 1024 × 0.5 = 512 s against SubCGE's best 0.25 s
    assert "| 1,024 | 0.2500 | 0.5000 | 512.0 |" in text
    assert "**Verdict: reproduced**: at 1,024 messages SubCGE takes 0.250 s and dense 512 s" in text
    assert (root / "docs" / "img" / "results_apply_cost.png").stat().st_size > 1000
    # pipeline: seeds save 1 − 600/1000 = 40% and 36%, 38.0 ± 12.706 × 0.0283 / √2 = 25.4;
    # throughput (1/3 + 5/16) / 2 / 0.2 − 1 = 61.5% more; on SWARM-direct's 800 s: 25% and 20%
    assert (
        "| homogeneous | high | 2 | 620 | 1000 | 38.0 ± 25.4% | 61.5% | 800 | 22.5 ± 31.8% "
        "| 10.0% / 10.0% | 50.0% / 50.0% |" in text
    )
    assert "**Verdict: partly** (GWTF ahead in a cell when its saving's interval lies" in text
    assert "GWTF ahead of SWARM in 1 of 1 cells; up to 38.0% less time (paper: up to 45%)" in text
    assert "restated as throughput, up to 61.5% more (paper: up to 30%)" in text
    assert "Relays sit idle 50.0–50.0% of the time" in text
    # links: 50% and 48% saved at spread 2, 20% and 18% at 0
    assert "| homogeneous | 2 | high | 2 | 510 | 1000 | 49.0 ± 12.7% |" in text
    assert "**Verdict: reproduced** (reproduced when GWTF is ahead at every spread" in text
    assert "high churn 19.0% at spread 0 → 49.0% at 2" in text
    # flow: both runs route the optimum and settle, within 1.03× of it
    assert "2 of 2 runs route the optimum's microbatches, 2 settle" in text
    assert "the slowest path is at most 1.010× and the total cost at most 1.030×" in text
    # recovery: each crash reran its own stage once, losses equal, gaps at most 2e-5 of a step
    assert "| 1 | 1: 1 / 1 | yes | 2.0e-05 | 0.200 |" in text
    assert (
        "3 of 3 crashes ran only their own stage again, 3 of 3 losses equal the calm one, "
        "weights within 2.0e-05 of a step; recovery took 0.100–0.300 s against 1.500 s for a "
        "restart of all 3 stages" in text
    )
    found = text[text.index("## What we found") : text.index("## 1. Main")]
    assert "heterogeneous communication (§6b) | reproduced |" in found
    assert "near-optimal against a centralized scheme (§6c) | reproduced |" in found
    assert "without costly recomputation (§6d) | reproduced | 3 of 3 crashes" in found


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"extra_forwards": [1, 0, 1]}, "| 2 | 0: 1 / 0, 2: 1 / 1 | yes |"),
        ({"loss_equal": False}, "| 2 | 2: 1 / 1 | no |"),
        ({"weight_gap": 0.25}, "| 2 | 2: 1 / 1 | yes | 2.5e-01 |"),
    ],
)
def test_recovery_that_redoes_more_or_drifts_is_not_reproduced(
    root: Path, change: dict[str, object], shown: str
) -> None:
    path = root / "results" / "bench" / "crash_recovery.json"
    bench = json.loads(path.read_text())
    bench["crashes"][2] |= change
    path.write_text(json.dumps(bench))
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    assert shown in text
    assert "## 6d. GWTF's crash recovery on real stages\n" in text
    assert "without costly recomputation (§6d) | not |" in text


def test_fallback_and_absent_results(tmp_path: Path) -> None:
    write_run(tmp_path, "compare-sst2-ring16", "seedflood_seed-0", 0.72, method="seedflood")
    write_run(tmp_path, "compare-sst2-ring16", "dsgd_seed-0", 0.786, method="dsgd")
    text = write_paper_results(tmp_path, tmp_path / "results.md").read_text()
    assert "earlier single-setting comparison `results/compare-sst2-ring16`" in text
    assert "SeedFlood at 91.6% of DSGD (paper 94–96%)" in text
    assert "seedflood compare configs/paper/hops-ring64.yaml --out results/paper-hops" in text
    assert text.count("**Verdict: not yet run.**") == 9  # sections 1b-6d; 1 shows the fallback


def test_scaling_and_subcge_sections_read_their_grids(root: Path) -> None:
    for method, clients, accuracy in (
        ("dsgd", 16, 0.80),
        ("seedflood", 16, 0.76),
        ("seedflood", 128, 0.80),
        ("dsgd-lora", 16, 0.70),
        ("dsgd-lora", 128, 0.60),
        ("choco-lora", 16, 0.68),
        ("choco-lora", 64, 0.66),
    ):
        name = f"{method}_clients-{clients}_seed-0"
        gossip = {"client_accuracy": accuracy - 0.05, "consensus_distance": clients / 1000}
        spread = gossip if method != "seedflood" else {}
        write_run(root, "paper-scaling", name, accuracy, clients=clients, method=method, **spread)
    for rank, refresh, accuracy in ((8, 1000, 0.70), (32, 1000, 0.74), (32, 1, 0.66)):
        name = f"seedflood_refresh-{refresh}_rank-{rank}_seed-0"
        write_run(root, "paper-subcge", name, accuracy, rank=rank, refresh=refresh)
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    # normalised to DSGD@16's seed mean: this grid's seed 0 (0.80) and the SST-2 main grid's
    # seed 1 in the same setting (0.79), 0.795: 0.76 → 95.6%, 0.60 → 75.5%; 32 clients ran for
    # nobody
    assert "the mean of every seed run in this setting, 79.5% (seeds [0, 1]: 80.0%, 79.0%)" in text
    assert "| method | 16 | 64 | 128 |" in text
    assert "| seedflood | 95.6% | – | 100.6% |" in text
    assert "| dsgd-lora | 88.1% | – | 75.5% |" in text
    assert "| choco-lora | 85.5% | 83.0% | – |" in text
    assert (
        "**Verdict: reproduced** (a loss of more than 2 points of DSGD@16 counts as degrading): "
        "SeedFlood 95.6% at 16 → 100.6% at 128 clients (paper: 100.2% at 128); gossip: "
        "choco-lora 85.5% at 16 → 83.0% at 64; dsgd-lora 88.1% at 16 → 75.5% at 128; "
        "degrading: choco-lora, dsgd-lora of choco-lora, dsgd-lora." in text
    )
    # what the clients hold: gossip clients 5 points under the average, SeedFlood's identical
    assert "| seedflood | 76.0 / 0 | – | 80.0 / 0 |" in text
    assert "| dsgd-lora | 65.0 / 0.016 | – | 55.0 / 0.128 |" in text
    assert "| choco-lora | 63.0 / 0.016 | 61.0 / 0.064 | – |" in text
    assert (
        "The gossip clients evaluated score -5.0 points against their averaged model "
        "(client minus average), a model none of them holds; every SeedFlood client holds the "
        "model scored. From the fewest clients to the most: choco-lora 63.0% → 61.0% own "
        "accuracy, distance 0.016 → 0.064 (16 → 64 clients); dsgd-lora 65.0% → 55.0% own "
        "accuracy, distance 0.016 → 0.128 (16 → 128 clients)." in text
    )
    assert (root / "docs" / "img" / "results_scaling.png").stat().st_size > 1000
    assert "The bars:" not in text  # one seed a point: no intervals to draw
    # a period longer than the 30-step run never refreshes; empty cells stay empty
    assert "| rank | T = 1 | T = 1000 (never) |" in text
    assert (root / "docs" / "img" / "results_subcge.png").stat().st_size > 1000
    assert "| 8 | – | 70.0 |" in text
    assert "| 32 | 66.0 | 74.0 |" in text
    assert (
        "**Verdict: reproduced**: ranks below 32 under every rank from 32 at 1 of 1 refresh "
        "periods (T = 1000: best below 32 70.0%, worst from 32 74.0%); T = 1 loses more than 2 "
        "points to a longer period at rank 32 of 32." in text
    )
    assert text.count("**Verdict: not yet run.**") == 1  # the horizon's grid alone


def test_a_partial_grid_names_its_missing_runs_and_the_command(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "configs" / "paper").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "quickstart.yaml", root / "configs")
    shutil.copy(REPO / "configs" / "paper" / "subcge-ablation.yaml", root / "configs" / "paper")
    planned = plan(root / "configs" / "paper" / "subcge-ablation.yaml")
    for run, accuracy, seconds in zip(planned[:2], (0.72, 0.55), (610, 1490), strict=True):
        config = run.config.model_dump(mode="json")
        write_run(root, "paper-subcge", run.name, accuracy, wall_seconds=seconds, **config)
    # a run under another config than the grid's counts as missing, as compare would rerun it
    stale = planned[2]
    write_run(root, "paper-subcge", stale.name, 0.6, **{**stale.config.model_dump(), "lr": 0.5})
    # a run on a GPU counts as finished, and its minutes are kept apart from the CPU's
    on_gpu = planned[3]
    config = on_gpu.config.model_dump(mode="json")
    write_run(root, "paper-subcge", on_gpu.name, 0.7, wall_seconds=90, device="cuda", **config)
    # a run part-way through says how far its committed ledger got (SeedFlood's manifest and a
    # zeroth-order gossip run's scalar ledger each say what it runs under); one whose ledger was
    # made under another config, or on other data, says nothing, as compare would start it again
    sizes = planned[4].config
    now = {"train": sizes.n_train, "val": sizes.n_val, "test": sizes.n_test, "sha256": "a" * 64}
    monkeypatch.setattr(grid, "data_identity", lambda _config: now)
    for run, lr, data in (
        (planned[4], planned[4].config.lr, now),
        (planned[5], 0.5, now),
        (planned[6], planned[6].config.lr, {**now, "sha256": "b" * 64}),
        (planned[7], planned[7].config.lr, now),
    ):
        directory = root / "results" / "paper-subcge" / "runs" / run.name
        directory.mkdir(parents=True)
        config = {**run.config.model_dump(mode="json"), "lr": lr}
        if run is planned[4]:  # the record a scalar ledger's first line holds
            record = {"format": SCALARS_FORMAT, "config": config, "data": data, "base_hash": ""}
            (directory / SCALARS).write_text(json.dumps(record) + "\n[0.5]\n")
        else:
            (directory / "manifest.json").write_text(json.dumps({"config": config, "data": data}))
        history = [{"round": 0, "accuracy": 0.5}, {"round": 20, "accuracy": 0.665}]
        history = history[:1] if run is planned[7] else history  # before its first evaluation
        (directory / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
        point = {"round": 25, "train_seconds": 900.0, "wall_seconds": 1000.0}
        (directory / LAST_ROUND).write_text(json.dumps(point))
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    assert (
        "Not yet run: 9 of the 12 runs of configs/paper/subcge-ablation.yaml (`seedflood compare "
        "configs/paper/subcge-ablation.yaml --out results/paper-subcge` runs them and skips the "
        "finished ones):\n\n- seedflood (2 finished here in 10–25 min each; 1 finished on cuda "
        "in 2 min): refresh-1000_rank-64_seed-0, refresh-1_rank-32_seed-0 (round 25 of 30 so "
        f"far: validation 66.5% at round 20), {planned[5].name.removeprefix('seedflood_')}, "
        f"{planned[6].name.removeprefix('seedflood_')}, "
        f"{planned[7].name.removeprefix('seedflood_')} (round 25 of 30 so far)," in text
    )
    # a plot of the running grid draws the same part-way run, from its untrained evaluation on,
    # and no run that has not evaluated since
    running = in_progress(root, "subcge-ablation.yaml", "results/paper-subcge")
    assert running == [
        (planned[4].name, [{"round": 0, "accuracy": 0.5}, {"round": 20, "accuracy": 0.665}])
    ]
    # a run finished with the grid's config on other data is missing too, and named as such:
    # the results above it stand for the data it had
    other = planned[8]
    write_run(root, "paper-subcge", other.name, 0.7, **other.config.model_dump(mode="json"))
    path = root / "results" / "paper-subcge" / "runs" / other.name / "results.json"
    results = json.loads(path.read_text())
    path.write_text(json.dumps({**results, "data": {**now, "sha256": "c" * 64}}))
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    assert (
        "Not yet run: 9 of the 12 runs of configs/paper/subcge-ablation.yaml (`seedflood compare "
        "configs/paper/subcge-ablation.yaml --out results/paper-subcge` runs them and skips the "
        "finished ones); 1 of them ran with this config on the data directory as it was then"
    ) in text


def test_hops_compare_with_the_diameter_on_the_same_seeds(tmp_path: Path) -> None:
    """Diameter's seed 1 scores 10 points under its seed 0; k = 4 ran seed 0 only, so it is
    compared with diameter's seed 0 (−1.0), not with the two seeds' mean 67.0 (+4.0)."""
    for hops, seed, accuracy in (
        (None, 0, 0.72), (None, 1, 0.62), (4, 0, 0.71), (1, 0, 0.55), (1, 1, 0.45)
    ):  # fmt: skip
        name = f"hops-{hops or 'diameter'}_seed-{seed}"
        write_run(tmp_path, "paper-hops", name, accuracy, clients=64, hops=hops, seed=seed)
    text = write_paper_results(tmp_path, tmp_path / "results.md").read_text()
    assert "| diameter | 2 | 67.0 | +0.0 |" in text
    assert "| 4 | 1 | 71.0 | -1.0 |" in text
    assert "| 1 | 2 | 50.0 | -17.0 |" in text
    assert "no loss at k = 4; loss at k = 1;" in text


def test_regenerating_gives_the_same_bytes(root: Path) -> None:
    out = root / "docs" / "results.md"
    first = write_paper_results(root, out).read_bytes()
    assert write_paper_results(root, out).read_bytes() == first


def test_runs_off_the_cpu_are_named_with_their_tasks() -> None:
    def made(
        task: str,
        device: str | None,
        method: str = "seedflood",
        lora: bool = False,
        operator: str | None = None,
    ) -> Run:
        config = {"task": task, "method": method, "lora": lora}
        results = {"config": config, **({"device": device} if device else {})}
        if operator:
            results["mixing_operator"] = operator
        return Run(Path(f"{method}-{task}-{operator}"), results, [])

    runs = [made("boolq", "cuda"), made("boolq", "cuda"), made("rte", "cuda"), made("sst2", None)]
    assert device_note(runs)[0].startswith(
        "Device: every run on the CPU but 3 on cuda (boolq 2, rte 1). A GPU run draws the same"
    )
    assert "Void" not in device_note(runs)[0]
    assert device_note([made("sst2", None), made("rte", "cpu")]) == []
    # full-parameter first-order runs on a GPU are named void unless they mixed densely; their
    # LoRA variants and CPU runs are not
    runs += [made("boolq", "cuda", "dsgd"), made("boolq", "cuda", "dsgd", lora=True)]
    runs += [made("rte", None, "choco"), made("sst2", "cuda", "choco", operator="dense")]
    runs.append(made("sst2", "cuda", "choco", operator="sparse"))
    assert (
        "Void: the 2 full-parameter DSGD and ChocoSGD runs among them "
        "(choco-sst2-sparse, dsgd-boolq-None)." in (device_note(runs)[0])
    )


def test_a_data_note_reads_the_same_wherever_the_data_directory_was() -> None:
    notes = [
        f"rte: only 32 training examples available from {where}/superglue/RTE/train.jsonl; "
        "using 32 instead of 1024"
        for where in ("../shared/data", "/work/main/.devdata/data")
    ]
    assert {portable_note(n) for n in notes} == {
        "rte: only 32 training examples available from $SEEDFLOOD_DATA_DIR/superglue/RTE/"
        "train.jsonl; using 32 instead of 1024"
    }


def test_what_we_found_leads_with_every_claims_section_verdict(root: Path) -> None:
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    assert text.index("## What we found") < text.index("## 1. Main")
    assert (
        "| Flooding 4–8 hops a round loses nothing; 1–2 hops hurt (§4) | partly | no loss at "
        "k = 4; loss at k = 1; not yet run: k = 2, 8 |" in text
    )
    assert "(§2) | not yet run | No results under `results/paper-scaling/` |" in text
    assert "| reproduced | at 1,024 messages SubCGE takes 0.250 s and dense 512 s" in text
    assert "carried 8.3×10⁵ to 8.3×10⁵ times SeedFlood's" in text.split("## 1. Main")[0]


def test_consensus_counts_ring_meshgrid_pairs_made_on_one_device(tmp_path: Path) -> None:
    """Seed 0's pair agrees on the CPU; seed 1's pair ran on two devices and is set apart; a
    differing pair on one device makes the claim fail."""
    for seed, ring, mesh, device in ((0, "aa", "aa", None), (1, "bb", "cc", "cuda")):
        for topology, digest in (("ring", ring), ("meshgrid", mesh)):
            extra = {"device": device} if device and topology == "meshgrid" else {}
            name = f"seedflood_topology-{topology}_seed-{seed}"
            write_run(tmp_path, "paper-main-sst2", name, 0.7, seed=seed, topology=topology, **extra)
            path = tmp_path / "results" / "paper-main-sst2" / "runs" / name / "results.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "state_hash": digest}))
    assert consensus(tmp_path) == (
        "reproduced",
        "ring and meshgrid runs of one task and seed end on one state hash in 1 of 1 pairs made "
        "on one device (1 pairs ran on two devices, which round differently)",
    )
    path = tmp_path / "results" / "paper-main-sst2" / "runs"
    changed = path / "seedflood_topology-meshgrid_seed-0" / "results.json"
    changed.write_text(json.dumps({**json.loads(changed.read_text()), "state_hash": "zz"}))
    assert consensus(tmp_path)[0] == "not"  # type: ignore[index]


def test_the_pipeline_section_shows_deeper_pipelines_and_waste_by_cause(root: Path) -> None:
    results = root / "results"
    times = {("gwtf", 1.0): (900.0, 1100.0), ("swarm", 1.0): (1000.0, 1000.0)}
    write_pipeline_runs(results / "pipeline-deep", times, stages=16)
    # busy 100 s: GWTF recomputes 10 and discards 20; SWARM drops microbatches worth 30
    gwtf = {"recovery": 10.0, "crashed products": 20.0, "dropped microbatch": 0.0}
    swarm = {"recovery": 0.0, "crashed products": 5.0, "dropped microbatch": 30.0}
    for router, causes in (("gwtf", gwtf), ("swarm", swarm)):
        recomputed = causes["recovery"]
        compute = {"useful_s": 100.0 - sum(causes.values()), "recomputed_s": recomputed}
        compute |= {"discarded_s": sum(causes.values()) - recomputed, "waste_by_cause": causes}
        write_pipeline_runs(
            results / "pipeline-churn10" / router,
            {(router, 1.0): (700.0, 700.0)},
            churn="30",
            compute=compute,
        )
    text = write_paper_results(root, root / "docs" / "results.md").read_text()
    section = text[text.index("### Deeper pipelines") : text.index("## 6b.")]
    assert "Setting: 16 stages × 4 relays" in section
    assert "| homogeneous | high | 2 | 1000 | 1000 | 0.0 ± 127.1% |" in section
    assert "### Churn past the presets" in section
    assert "| homogeneous | 30 | 2 | 700 | 700 | 0.0 ± 0.0% |" in section
    assert (
        "| relays | churn | router | wasted | crashed products | dropped microbatch | recovery |"
        in (section)
    )
    # wasted_fraction is the run's own figure (0.1); the causes are shares of busy time
    assert "| homogeneous | 30 | gwtf | 10.0% | 20.0% | 0.0% | 10.0% |" in section
    assert "| homogeneous | 30 | swarm | 10.0% | 5.0% | 30.0% | 0.0% |" in section
