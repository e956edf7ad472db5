"""A simulated run's TensorBoard event files: each evaluation's scalars with the run's numbers,
each round once after a resume, a wall time that counts loading, and `seedflood report`'s plot
of them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import RunConfig, load_config
from seedflood.files import read_jsonl
from seedflood.learning.schedules import lr_schedule
from seedflood.sim import runner
from seedflood.sim.tracking import BOARD, LEARNING_RATE, SECONDS_PER_STEP, TAGS, read_board

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
LOADING_SECONDS = 0.5
REQUIRED = {
    "train/loss",
    "validation/accuracy",
    "traffic/bytes_per_edge_mean",
    "traffic/bytes_per_edge_max",
    "consensus/distance",
    LEARNING_RATE,
    SECONDS_PER_STEP,
}


def tiny_config(data_dir: Path, *extra: str) -> RunConfig:
    settings = ["model=tiny", "clients=4", "rounds=6", "eval_every=3", "batch_size=4"]
    settings += ["n_train=64", "n_val=16", "n_test=16", "warmup_ratio=0.3", "lr_schedule=cosine"]
    return load_config(QUICKSTART, [*settings, f"data_dir={data_dir}", *extra])


real_build = runner.build


def slow_build(*args: Any, **kwargs: Any) -> runner.Experiment:
    """The run's build, made to load for a known time."""
    time.sleep(LOADING_SECONDS)
    return real_build(*args, **kwargs)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def finished(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunConfig, Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("tracked")
    config = tiny_config(data_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "build", slow_build)
        results = runner.run(config, out)
    return config, out, results


def test_event_files_hold_every_scalar_of_the_history(
    finished: tuple[RunConfig, Path, dict[str, Any]],
) -> None:
    config, out, _ = finished
    history = read_jsonl(out / "history.jsonl")
    board = read_board(out)
    assert board.keys() >= REQUIRED
    for field, tag in TAGS.items():
        expected = [(h["round"], pytest.approx(h[field], rel=1e-6)) for h in history if field in h]
        assert board.get(tag, []) == expected, tag
    assert [step for step, _ in board["validation/accuracy"]] == [0, 3, 6]
    assert [step for step, _ in board["train/loss"]] == [3, 6]
    rate = lr_schedule(config)
    assert board[LEARNING_RATE] == [(3, pytest.approx(rate(2))), (6, pytest.approx(rate(5)))]
    assert rate(2) != rate(5)  # warm-up then decay: the plotted rate is the schedule's
    seconds = [h["train_seconds"] for h in history]
    assert board[SECONDS_PER_STEP] == [
        (3, pytest.approx((seconds[1] - seconds[0]) / 3)),
        (6, pytest.approx((seconds[2] - seconds[1]) / 3)),
    ]


def test_wall_time_counts_loading_and_training_time_does_not(
    finished: tuple[RunConfig, Path, dict[str, Any]],
) -> None:
    _, _, results = finished
    assert results["train_seconds"] > 0
    assert results["wall_seconds"] >= results["train_seconds"] + LOADING_SECONDS


class Killed(Exception):
    """Stands for the SIGKILL that `maybe_kill` sends a child process."""


def test_a_resumed_run_shows_each_round_once(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after round 6's evaluation was written but before its checkpoint, a run whose
    checkpoint is its only state (first-order gossip keeps no ledger) resumes from round 3's and
    writes round 6 again: the files hold it twice, TensorBoard shows it once, with the resumed
    run's values."""
    config = tiny_config(data_dir, "rounds=9", "method=dsgd")

    def kill_after_history(_requested: object, done: int, point: str) -> None:
        if (done, point) == (6, "history"):
            raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(runner, "maybe_kill", kill_after_history)
        with pytest.raises(Killed):
            runner.run(config, tmp_path)
    runner.run(config, tmp_path, resume=True)

    raw = EventAccumulator(str(tmp_path / BOARD), purge_orphaned_data=False)
    raw.Reload()
    assert [e.step for e in raw.Scalars("validation/accuracy")] == [0, 3, 6, 6, 9]
    board = read_board(tmp_path)
    history = read_jsonl(tmp_path / "history.jsonl")
    assert [h["round"] for h in history] == [0, 3, 6, 9]
    for tag, points in board.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), tag
    assert board["validation/accuracy"] == [
        (h["round"], pytest.approx(h["accuracy"], rel=1e-6)) for h in history
    ]
    assert [step for step, _ in board[SECONDS_PER_STEP]] == [3, 6, 9]


def test_a_run_started_afresh_replaces_the_old_event_files(data_dir: Path, tmp_path: Path) -> None:
    """Runs writing into one directory leave one run's files there: the last one's."""
    config = tiny_config(data_dir, "rounds=3")
    runner.run(config, tmp_path)
    runner.run(config, tmp_path)
    assert len(list((tmp_path / BOARD).iterdir())) == 1
    assert [step for step, _ in read_board(tmp_path)["validation/accuracy"]] == [0, 3]


@pytest.mark.slow
def test_report_plots_the_event_files(
    finished: tuple[RunConfig, Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, out, _ = finished
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    plot = tmp_path / "report" / "tensorboard.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 50_000  # eight panels of curves, not an empty figure
    assert "(tensorboard.png)" in (tmp_path / "report" / "report.md").read_text()

    (out / "results.json").rename(out / "finished.json")  # as a run still in progress
    try:
        result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "live")])
    finally:
        (out / "finished.json").rename(out / "results.json")
    assert result.exit_code == 0, result.output
    assert "(tensorboard.png)" in (tmp_path / "live" / "report.md").read_text()
    assert (tmp_path / "live" / "tensorboard.png").is_file()
