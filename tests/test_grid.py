"""Grids expand, validate up front and resume; reports aggregate seeds and draw the plots."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import ConfigError
from seedflood.files import atomic_write_json, atomic_write_jsonl
from seedflood.grid import LOCK_NAME, claimed, data_identity, parse_where, plan
from seedflood.report import find_runs, head_to_head, summarize, write_report

PNG = b"\x89PNG\r\n\x1a\n"


def grid(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return path


def test_grid_expands_variants_times_swept_values(tmp_path: Path) -> None:
    runs = plan(
        grid(
            tmp_path,
            "common: {rounds: 3}\n"
            "variants:\n  seedflood: {lr: 0.01}\n  dsgd-lora: {method: dsgd, lora: true}\n"
            "grid:\n  clients: [8, 16]\n  seed: [0, 1]\n",
        )
    )
    assert len(runs) == 2 * 2 * 2
    assert runs[0].name == "seedflood_clients-8_seed-0"
    assert runs[-1].name == "dsgd-lora_clients-16_seed-1"
    assert {r.config.name for r in runs} == {"seedflood", "dsgd-lora"}
    assert all(r.config.rounds == 3 for r in runs)
    assert [r.config.clients for r in runs[:4]] == [8, 8, 16, 16]


def test_a_variant_can_narrow_the_sweep(tmp_path: Path) -> None:
    runs = plan(
        grid(
            tmp_path,
            "variants:\n  seedflood: {}\n  dsgd: {method: dsgd, grid: {clients: [16]}}\n"
            "grid:\n  clients: [16, 32, 64]\n",
        )
    )
    assert [r.name for r in runs] == [
        "seedflood_clients-16",
        "seedflood_clients-32",
        "seedflood_clients-64",
        "dsgd_clients-16",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("variants:\n  bad: {lr: -1}\n", r"(?s)variant 'bad' with \{\}: .*key 'lr'"),
        ("grid:\n  clients: 16\n", "grid key 'clients' needs a non-empty list"),
        ("sweep: {}\n", r"unknown key\(s\) \['sweep'\]"),
        ("variants: [1, 2]\n", "variants must be a mapping"),
    ],
)
def test_bad_grids_are_refused_before_anything_runs(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(grid(tmp_path, text))


def fake_run(
    root: Path,
    method: str,
    clients: int,
    seed: int,
    accuracy: float,
    size: float,
    history: list[tuple[int, float, float]] | None = None,
):
    directory = root / f"{method}-{clients}-{seed}"
    atomic_write_json(
        directory / "results.json",
        {
            "method": method,
            "topology": "ring",
            "clients": clients,
            "accuracy": accuracy,
            "zero_shot_accuracy": 0.5,
            "bytes_per_edge_max": size,
            "steps": 10,
            "rounds": 5,
            "wall_seconds": 12.0,
            "train_seconds": 10.0,
            "config": {"task": "sst2", "seed": seed},
        },
    )
    points = history or [(0, 0.5, 0.0), (5, accuracy, 10.0)]
    atomic_write_jsonl(
        directory / "history.jsonl",
        [{"round": r, "accuracy": a, "train_seconds": t} for r, a, t in points],
    )


def test_report_aggregates_seeds_and_draws_every_plot(tmp_path: Path) -> None:
    fake_run(tmp_path, "dsgd", 16, 0, 0.80, 5e8)
    fake_run(tmp_path, "dsgd", 16, 1, 0.90, 5e8)
    fake_run(tmp_path, "dsgd", 32, 0, 0.70, 5e8)
    fake_run(tmp_path, "seedflood", 16, 0, 0.75, 4e5)
    fake_run(tmp_path, "seedflood", 32, 0, 0.85, 8e5)
    rows = summarize(find_runs([tmp_path]))
    dsgd16 = next(r for r in rows if r["method"] == "dsgd" and r["clients"] == 16)
    assert dsgd16["seeds"] == 2
    assert dsgd16["accuracy"] == pytest.approx(0.85)
    assert dsgd16["accuracy_std"] == pytest.approx(0.0707107, rel=1e-5)
    report = write_report([tmp_path], tmp_path / "report")
    text = report.read_text()
    assert "| dsgd | sst2 | ring | 16 | 2 | 10 | 85.0 ± 7.1 | 50.0 | 500 MB | 10 | 12 |" in text
    assert "| seedflood | sst2 | ring | 32 | 1 | 10 | 85.0 | 50.0 | 800 KB |" in text
    for plot in ("accuracy_vs_bytes.png", "scaling.png", "curves.png"):
        assert (tmp_path / "report" / plot).read_bytes()[:8] == PNG
        assert plot in text
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert len(summary) == 4


def test_head_to_head_reads_seedflood_at_equal_rounds_and_time(tmp_path: Path) -> None:
    fake_run(tmp_path, "dsgd", 16, 0, 0.8, 4e8, [(0, 0.5, 0.0), (3, 0.8, 60.0)])
    fake_run(
        tmp_path,
        "seedflood",
        16,
        0,
        0.7,
        4e3,
        [(0, 0.5, 0.0), (3, 0.55, 40.0), (6, 0.6, 80.0), (30, 0.7, 400.0)],
    )
    rows = head_to_head(find_runs([tmp_path]))
    assert rows == [
        {
            "method": "dsgd",
            "rounds": 3,
            "train_seconds": 60.0,
            "accuracy": 0.8,
            "seedflood_equal_rounds": 0.55,
            "seedflood_equal_time": 0.55,
            "seedflood_final": 0.7,
            "bytes_ratio": 1e5,
        }
    ]
    text = write_report([tmp_path], tmp_path / "out").read_text()
    assert "| dsgd | 3 | 60 | 80.0 | 55.0 | 55.0 | 70.0 | 100,000× |" in text


def test_report_without_a_scaling_grid_skips_that_plot(tmp_path: Path) -> None:
    fake_run(tmp_path, "seedflood", 16, 0, 0.75, 4e5)
    report = write_report([tmp_path], tmp_path / "out")
    assert "scaling.png" not in report.read_text()
    with pytest.raises(ValueError, match=r"no results\.json"):
        write_report([tmp_path / "out"], tmp_path / "elsewhere")


@pytest.mark.slow
def test_compare_resumes_and_reruns_only_what_changed(tmp_path: Path) -> None:
    data = tmp_path / "data" / "sst2"
    data.mkdir(parents=True)
    rows = [
        {"idx": i, "sentence": f"film {i} was {'good' if i % 2 else 'bad'}", "label": i % 2}
        for i in range(40)
    ]
    for split in ("train", "validation"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = (
        f"common: {{model: tiny, data_dir: {tmp_path / 'data'}, clients: 4, rounds: 2, rank: 8,"
        " batch_size: 2, n_train: 16, n_val: 8, n_test: 8, eval_every: 1}\n"
        "variants:\n  seedflood: {lr: 0.01}\n  dsgd: {method: dsgd, lr: LR}\n"
    )
    out = tmp_path / "out"
    path = grid(tmp_path, spec.replace("LR", "0.01"))
    first = CliRunner().invoke(app, ["compare", str(path), "--out", str(out)])
    assert first.exit_code == 0, first.output
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("results.json")}
    assert len(stamps) == 2 and (out / "report.md").is_file()
    # each evaluation is a log line (a lane's log file shows no progress bar)
    said = " ".join(first.output.split())
    assert said.count("seedflood: round ") == 2 and said.count("dsgd: round ") == 2
    assert "dsgd: round 2: train loss" in said and "val accuracy" in said
    again = CliRunner().invoke(app, ["compare", str(path), "--out", str(out)])
    assert again.output.count("skip") == 2
    assert {p: p.stat().st_mtime_ns for p in out.rglob("results.json")} == stamps
    # a run made before a key existed counts that key at its default
    older = out / "runs" / "seedflood" / "results.json"
    stored = json.loads(older.read_text())
    del stored["config"]["eval_clients"]
    atomic_write_json(older, stored)
    stamps[older] = older.stat().st_mtime_ns
    assert plan(path)[0].is_done(out)
    changed = grid(tmp_path, spec.replace("LR", "0.02"))
    third = CliRunner().invoke(app, ["compare", str(changed), "--out", str(out)])
    assert third.output.count("skip") == 1
    rerun = out / "runs" / "dsgd" / "results.json"
    assert rerun.stat().st_mtime_ns != stamps[rerun]
    assert json.loads(rerun.read_text())["config"]["lr"] == 0.02
    # a run another live process holds is left to it, even when this grid would rerun it
    lock = out / "runs" / "dsgd" / LOCK_NAME
    lock.write_text(f"{os.getpid()} {socket.gethostname()}")
    before = rerun.stat().st_mtime_ns
    changed_again = grid(tmp_path, spec.replace("LR", "0.03"))
    held = CliRunner().invoke(app, ["compare", str(changed_again), "--out", str(out)])
    assert held.exit_code == 0, held.output
    assert f"skip dsgd: pid {os.getpid()} on {socket.gethostname()} is running it" in " ".join(
        held.output.split()
    )
    assert rerun.stat().st_mtime_ns == before and lock.is_file()


def test_a_claim_is_exclusive_released_and_taken_over_from_the_dead(tmp_path: Path) -> None:
    directory = tmp_path / "runs" / "x"
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    with claimed(directory) as holder:
        assert holder is None
        with claimed(directory) as second:
            assert second == me
        assert (directory / LOCK_NAME).is_file()
    assert not (directory / LOCK_NAME).exists()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    (directory / LOCK_NAME).write_text(f"{finished.pid} {socket.gethostname()}")
    with claimed(directory) as holder:
        assert holder is None
        assert (directory / LOCK_NAME).read_text() == f"{os.getpid()} {socket.gethostname()}"
    (directory / LOCK_NAME).write_text("1 another-machine")
    with claimed(directory) as holder:
        assert holder == "pid 1 on another-machine"
    assert (directory / LOCK_NAME).read_text() == "1 another-machine"


@pytest.mark.parametrize("path", sorted(Path("configs/paper").glob("*.yaml")), ids=str)
def test_shipped_grids_are_valid(path: Path) -> None:
    runs = plan(path)
    assert runs and all(r.config.model == "smollm2-135m" for r in runs)


@pytest.mark.slow
def test_a_run_finished_by_another_process_while_this_one_waited_is_not_redone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes share a grid: one plans a run, the other finishes it just before the first
    claims it. The first must then see the results and skip, not redo (and erase) them."""
    data = tmp_path / "data" / "sst2"
    data.mkdir(parents=True)
    rows = [{"idx": i, "sentence": f"film {i}", "label": i % 2} for i in range(40)]
    for split in ("train", "validation"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = grid(
        tmp_path,
        f"common: {{model: tiny, data_dir: {tmp_path / 'data'}, clients: 4, rounds: 1, rank: 8,"
        " batch_size: 2, n_train: 16, n_val: 8, n_test: 8}\n"
        "variants:\n  seedflood: {lr: 0.01}\n",
    )
    finished = tmp_path / "finished"
    assert CliRunner().invoke(app, ["compare", str(path), "--out", str(finished)]).exit_code == 0
    made = (finished / "runs" / "seedflood" / "results.json").read_bytes()
    real_claim = claimed

    def finished_elsewhere_first(directory: Path):  # type: ignore[no-untyped-def]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "results.json").write_bytes(made)
        return real_claim(directory)

    monkeypatch.setattr("seedflood.grid.claimed", finished_elsewhere_first)
    raced = tmp_path / "raced"
    result = CliRunner().invoke(app, ["compare", str(path), "--out", str(raced)])
    assert result.exit_code == 0, result.output
    assert "skip seedflood: finished earlier with this config" in " ".join(result.output.split())
    assert (raced / "runs" / "seedflood" / "results.json").read_bytes() == made
    # Its history stayed with the other process: the report has no curves to draw.
    assert not (raced / "curves.png").exists()
    assert "curves.png" not in (raced / "report.md").read_text()
    assert "curves.png" in (finished / "report.md").read_text()


def test_a_run_made_on_other_data_is_not_done(tmp_path: Path) -> None:
    """What a run trained on is part of what makes it the same run: results recorded on other
    examples, or (before results recorded them) on fewer than the data now holds, are redone."""
    data = tmp_path / "data" / "sst2"
    data.mkdir(parents=True)

    def write(count: int, word: str) -> None:
        rows = [{"idx": i, "sentence": f"{word} {i}", "label": i % 2} for i in range(count)]
        for split in ("train", "validation"):
            (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(40, "film")
    spec = f"common: {{model: tiny, data_dir: {data.parent}, n_train: 16, n_val: 8, n_test: 8}}\n"
    (run,) = plan(grid(tmp_path, spec + "variants:\n  seedflood: {lr: 0.01}\n"))
    out = tmp_path / "out"
    results = {"config": run.config.model_dump(mode="json"), "data_notes": []}
    atomic_write_json(
        run.directory(out) / "results.json", {**results, "data": data_identity(run.config)}
    )
    assert run.is_done(out)
    write(40, "movie")  # the same counts, other sentences
    assert not run.is_done(out)
    # an older results file without a data record: its shortfall note against today's data
    short = "sst2: only 12 training examples available from x; using 12 instead of 16"
    atomic_write_json(run.directory(out) / "results.json", {**results, "data_notes": [short]})
    assert not run.is_done(out)
    atomic_write_json(run.directory(out) / "results.json", results)
    assert run.is_done(out)


def test_where_narrows_to_config_values_under_the_grids_own_names(tmp_path: Path) -> None:
    path = grid(
        tmp_path,
        "variants:\n  seedflood: {}\n  dsgd-lora: {method: dsgd, lora: true}\n"
        "grid:\n  seed: [0, 1, 2]\n  clients: [16, 32]\n",
    )
    whole = {run.name: run for run in plan(path)}
    narrowed = plan(path, ["seedflood"], parse_where(["seed=1,2", "clients=16"]))
    assert [run.name for run in narrowed] == [
        "seedflood_seed-1_clients-16",
        "seedflood_seed-2_clients-16",
    ]
    assert all(run.config == whole[run.name].config for run in narrowed)
    assert [run.name for run in plan(path, where={"lora": ["true"], "seed": ["0"]})] == [
        "dsgd-lora_seed-0_clients-16",
        "dsgd-lora_seed-0_clients-32",
    ]
    flooded = grid(tmp_path, "variants:\n  k-2: {hops: 2}\n  k-diameter: {hops: null}\n")
    assert [run.name for run in plan(flooded, where={"hops": ["null"]})] == ["k-diameter"]


@pytest.mark.parametrize(
    ("conditions", "message"),
    [
        (["seed"], r"--where 'seed': expected KEY=VALUE"),
        (["=1"], r"--where '=1': expected KEY=VALUE"),
        (["seed="], r"--where 'seed=': expected KEY=VALUE"),
        (["sede=1"], r"unknown config key\(s\) \['sede'\]; allowed: .*seed"),
        (["seed=7"], r"matches no run of the grid; its runs take seed in \['0', '1'\]"),
    ],
)
def test_a_bad_where_is_refused_naming_what_is_allowed(
    tmp_path: Path, conditions: list[str], message: str
) -> None:
    path = grid(tmp_path, "grid:\n  seed: [0, 1]\n")
    with pytest.raises(ConfigError, match=message):
        plan(path, where=parse_where(conditions))


def test_compare_refuses_a_bad_where_without_a_traceback(tmp_path: Path) -> None:
    path = grid(tmp_path, "grid:\n  seed: [0, 1]\n")
    result = CliRunner().invoke(
        app, ["compare", str(path), "--out", str(tmp_path / "out"), "--where", "seed=5"]
    )
    assert result.exit_code != 0
    assert "matches no run of the grid" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
