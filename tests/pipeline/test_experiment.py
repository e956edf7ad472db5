"""GWTF against SWARM end to end: a simulated run replayed through real stages, the comparison
grid resumes, the report quotes ratios, and the command line refuses bad input by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.files import atomic_write_json_gz, read_json
from seedflood.learning.models import load_model
from seedflood.pipeline.costs import random_scenario
from seedflood.pipeline.experiment import compare_grid, replay_losses, run_pipeline, time_to
from seedflood.pipeline.report import cells, write_pipeline_report
from seedflood.pipeline.routers import simulate
from seedflood.pipeline.stages import PipelineTrainer, split_llama

TEXTS = [f"review {i}: {'a delight' if i % 2 else 'a bore'}" for i in range(32)]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny", seed=0)


def small(seed: int = 0, heterogeneous: bool = True):
    return random_scenario(
        seed, stages=2, relays_per_stage=3, holders=1, microbatches=4, heterogeneous=heterogeneous
    )


def test_a_run_trains_real_stages_on_the_routed_paths(tiny) -> None:
    model, tokenizer = tiny
    record = run_pipeline(
        small(),
        router="gwtf",
        churn="none",
        seed=0,
        microbatches=12,
        model=model,
        tokenizer=tokenizer,
        texts=TEXTS,
    )
    assert record["microbatches_trained"] >= 12 and record["time_to_target_s"] > 0
    trained_iterations = [it for it in record["iterations"] if it["microbatches"]]
    curve = record["loss_curve"]
    assert [p["time_s"] for p in curve] == [it["end_s"] for it in trained_iterations]
    assert all(torch.isfinite(torch.tensor(p["loss"])) for p in curve)
    assert curve[-1]["loss"] < curve[0]["loss"]  # SGD on repeated texts lowers the loss


def test_replay_equals_plain_pipelined_training_on_the_same_paths(tiny) -> None:
    model = tiny[0]
    result = simulate(small(), router="swarm", churn="none", microbatches_target=8, seed=1)
    batches = [
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        for ids in torch.randint(5, 200, (64, 4, 12), generator=torch.Generator().manual_seed(0))
    ]
    curve = replay_losses(result, model, 2, iter(batches), lr=0.1)
    used = iter(batches)
    relays: list[dict[str, int]] = [{}, {}]
    for record in result.iterations:
        for trained in record.trained:
            for stage, relay in enumerate(trained.path):
                relays[stage].setdefault(relay, len(relays[stage]))
    trainer = PipelineTrainer(split_llama(model, 2), [len(r) for r in relays])
    expected = [
        trainer.train_iteration(
            [next(used) for _ in record.trained],
            [[relays[s][r] for s, r in enumerate(t.path)] for t in record.trained],
            0.1,
        )
        for record in result.iterations
        if record.trained
    ]
    assert [p["loss"] for p in curve] == pytest.approx(expected, rel=1e-6)
    assert time_to(result, 8) == result.total_time_s


def test_the_grid_resumes_and_the_report_compares_cell_by_cell(tmp_path: Path) -> None:
    grid = {
        "seeds": [0, 1],
        "churn_levels": ["none", "high"],
        "resources": ["heterogeneous"],
        "microbatches": 16,
        "stages": 2,
        "relays_per_stage": 3,
    }
    runs = compare_grid(tmp_path, **grid)
    files = sorted((tmp_path / "runs").glob("*.json.gz"))
    assert len(runs) == 8 and len(files) == 8
    # stored compressed, and read back as the records the grid returned
    assert sorted(read_json(path)["name"] for path in files) == sorted(r["name"] for r in runs)
    names = []
    resumed = compare_grid(tmp_path, **grid, show=names.append)
    assert resumed == json.loads(json.dumps(runs)) and names == []
    # the same record gives the same bytes, and a run stored as plain JSON (before runs were
    # compressed) still counts as finished
    first = files[0].read_bytes()
    atomic_write_json_gz(files[0], read_json(files[0]))
    assert files[0].read_bytes() == first
    plain = files[0].with_suffix("")
    plain.write_text(json.dumps(read_json(files[0])))
    files[0].unlink()
    assert compare_grid(tmp_path, **grid, show=names.append) == resumed and names == []
    assert not files[0].exists()
    rows = cells(runs)
    assert [(r["resources"], r["churn"], r["seeds"]) for r in rows] == [
        ("heterogeneous", "none", 2),
        ("heterogeneous", "high", 2),
    ]
    for row in rows:
        gwtf = [r for r in runs if r["churn"] == row["churn"] and r["router"] == "gwtf"]
        mean_time = sum(r["time_to_target_s"] for r in gwtf) / 2
        assert row["gwtf_time_s"] == pytest.approx(mean_time)
        assert row["less_time"] == pytest.approx(1 - row["gwtf_time_s"] / row["swarm_time_s"])
    report = write_pipeline_report(runs, tmp_path).read_text()
    assert "| heterogeneous | high | 2 |" in report and "Best cells:" in report
    for image in ("progress.png", "iteration_times.png", "wasted_compute.png"):
        assert (tmp_path / image).stat().st_size > 0


def test_the_command_line_runs_a_scenario_and_reports_it(tmp_path: Path) -> None:
    runner = CliRunner()
    scenario = tmp_path / "scenario.yaml"
    made = runner.invoke(
        app, ["pipeline", "scenario", str(scenario), "--stages", "2", "--relays-per-stage", "3"]
    )
    assert made.exit_code == 0, made.output
    routed = runner.invoke(app, ["pipeline", "flow", str(scenario)])
    values = re.findall(r"(centralized|decentralized): (\d+) microbatches", routed.output)
    assert routed.exit_code == 0 and len(values) == 2 and values[0][1] == values[1][1]
    for router in ("gwtf", "swarm"):
        result = runner.invoke(
            app,
            [
                "pipeline",
                "run",
                str(scenario),
                "--router",
                router,
                "--microbatches",
                "16",
                "--churn",
                "1.5",
                "--no-train",
                "--out",
                str(tmp_path / router),
            ],
        )
        assert result.exit_code == 0, result.output
        record = json.loads((tmp_path / router / "pipeline.json").read_text())
        assert record["router"] == router and record["microbatches_trained"] >= 16
    reported = runner.invoke(app, ["report", str(tmp_path)])
    assert reported.exit_code == 0, reported.output
    assert "| scenario | 1.5 | 1 |" in (tmp_path / "report.md").read_text()
    bad = runner.invoke(app, ["pipeline", "run", str(scenario), "--churn", "stormy"])
    assert bad.exit_code == 2 and "neither a preset" in bad.output
    missing = runner.invoke(app, ["pipeline", "run", str(tmp_path / "nope.yaml"), "--no-train"])
    assert missing.exit_code == 2


def test_the_comparison_sweeps_link_spreads_and_both_swarms_and_refuses_bad_lists(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    grid = ["--seeds", "1", "--microbatches", "8", "--stages", "2", "--relays-per-stage", "3"]
    grid += ["--churn", "none", "--resources", "heterogeneous", "--no-train", "--out"]
    sweep = ["--routers", "gwtf,swarm,swarm-direct", "--links", "0,1"]
    swept = runner.invoke(app, ["pipeline", "compare", *grid, str(tmp_path), *sweep])
    assert swept.exit_code == 0, swept.output
    names = sorted(path.name.removesuffix(".json.gz") for path in (tmp_path / "runs").iterdir())
    assert names == [
        f"heterogeneous{links}-none-s0-{router}"
        for links in ("-links0", "")
        for router in ("gwtf", "swarm", "swarm-direct")
    ]
    runs = [read_json(tmp_path / "runs" / f"{name}.json.gz") for name in names]
    assert [run["link_spread"] for run in runs] == [0.0] * 3 + [1.0] * 3
    report = (tmp_path / "report.md").read_text()
    assert "| heterogeneous | none | 1 |" in report  # the main table: measured links only
    assert "## By link heterogeneity" in report
    assert re.search(r"\| heterogeneous \| none \| 0 \| 1 \| \d+ \| \d+ \| -?\d+\.\d% ", report)
    plain = compare_grid(
        tmp_path, seeds=[0], churn_levels=["none"], resources=["heterogeneous"],
        microbatches=8, stages=2, relays_per_stage=3,
    )  # fmt: skip
    assert (
        len(plain) == 2
        and "By link heterogeneity"
        not in write_pipeline_report(plain, tmp_path / "plain").read_text()
    )
    for option, value, allowed in [
        ("--links", "1,-1", "distinct numbers >= 0"),
        ("--links", "wide", "distinct numbers >= 0"),
        ("--routers", "gwtf,petals", "gwtf, swarm, swarm-direct"),
        ("--churn", "none,none", "none, low, high"),
        ("--churn", "high,stormy", "neither a preset"),
        ("--churn", "-3", "neither a preset"),
        ("--resources", "", "homogeneous, heterogeneous"),
    ]:
        bad = runner.invoke(app, ["pipeline", "compare", *grid, str(tmp_path), option, value])
        assert bad.exit_code == 2 and allowed in " ".join(bad.output.split()), bad.output


def test_the_comparison_takes_a_churn_rate_past_the_presets(tmp_path: Path) -> None:
    """30 crashes (and joins) per relay-hour, ten times the `high` preset's crashes."""
    grid = ["--seeds", "1", "--microbatches", "8", "--stages", "2", "--relays-per-stage", "3"]
    grid += ["--churn", "30", "--resources", "homogeneous", "--no-train", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, ["pipeline", "compare", *grid])
    assert result.exit_code == 0, result.output
    runs = {r["name"]: r for r in map(read_json, (tmp_path / "runs").glob("*.json.gz"))}
    assert sorted(runs) == ["homogeneous-30-s0-gwtf", "homogeneous-30-s0-swarm"]
    assert all(run["churn"] == "30" and run["churn_events"] > 0 for run in runs.values())
    for run in runs.values():  # the waste by cause adds up to what counts as wasted
        compute = run["compute"]
        wasted = compute["recomputed_s"] + compute["discarded_s"]
        assert sum(compute["waste_by_cause"].values()) == pytest.approx(wasted)
    assert runs["homogeneous-30-s0-gwtf"]["compute"]["waste_by_cause"]["dropped microbatch"] == 0
