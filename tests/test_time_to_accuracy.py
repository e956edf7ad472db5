"""benchmarks/time_to_accuracy.py reads a finished run: the first evaluation at the target, the
training seconds there, and the pace of a step."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "time_to_accuracy.py"


def _script():
    spec = importlib.util.spec_from_file_location("time_to_accuracy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(directory: Path, accuracies: list[float], seconds: list[float]) -> Path:
    directory.mkdir()
    rows = [
        {"round": 50 * i, "accuracy": a, "train_seconds": s}
        for i, (a, s) in enumerate(zip(accuracies, seconds, strict=True))
    ]
    (directory / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {"config": {"local_steps": 1}, "device": "cpu", "accuracy": 0.83}
    (directory / "results.json").write_text(json.dumps(results))
    return directory


def test_the_first_evaluation_at_the_target_and_the_pace_are_reported(tmp_path: Path) -> None:
    script = _script()
    run = _run(tmp_path / "run", [0.5, 0.7, 0.81, 0.79, 0.9], [0, 400, 800, 1600, 2000])
    row = script.time_to_accuracy(run, 0.8)
    assert (row["reached"], row["step"], row["train_seconds"]) == (True, 100, 800)
    assert row["seconds_per_step_median"] == 8.0 and row["seconds_per_step_fastest"] == 8.0
    assert row["train_seconds_at_median_pace"] == 800.0 and row["best_accuracy"] == 0.9
    short = script.time_to_accuracy(run, 0.95)
    assert short["reached"] is False and "step" not in short


def test_a_folder_without_a_finished_run_is_named(tmp_path: Path, capsys) -> None:
    script = _script()
    assert script.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert str(tmp_path) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--target", "x", str(tmp_path)])
