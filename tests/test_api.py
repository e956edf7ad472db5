"""The Python API: train, compare and replay return what the commands write, with the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import seedflood
from seedflood.cli import app
from seedflood.learning.models import state_hash

TINY = {
    "model": "tiny",
    "clients": 4,
    "rounds": 4,
    "eval_every": 2,
    "rank": 8,
    "batch_size": 4,
    "n_train": 64,
    "n_val": 16,
    "n_test": 40,
    "lr": 0.05,
}
TIMINGS = {"wall_seconds", "train_seconds", "peak_rss_mb", "peak_device_mb"}


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMINGS}


@pytest.mark.slow
def test_train_returns_the_model_and_equals_the_command_line(
    data_dir: Path, tmp_path: Path, one_thread, capfd
) -> None:
    config = {**TINY, "data_dir": str(data_dir)}
    result = seedflood.train(config, tmp_path / "api", quiet=True)
    assert capfd.readouterr().err == ""  # quiet: no progress
    (tmp_path / "run.yaml").write_text(json.dumps(config))
    cli = CliRunner().invoke(
        app, ["run", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "cli")]
    )
    assert cli.exit_code == 0, cli.output
    from_cli = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert without_timings(result.metrics) == without_timings(from_cli)
    assert result.out == tmp_path / "api" and len(result.history) == 3  # rounds 0, 2, 4
    assert result.history[-1]["accuracy"] == pytest.approx(
        json.loads((tmp_path / "cli" / "history.jsonl").read_text().splitlines()[-1])["accuracy"]
    )
    model = result.model
    assert state_hash(list(model.parameters())) == state_hash(
        list(seedflood.train(config, tmp_path / "api", quiet=True).model.parameters())
    )


@pytest.mark.slow
def test_replay_and_compare(data_dir: Path, tmp_path: Path, one_thread) -> None:
    config = seedflood.RunConfig(**TINY, data_dir=str(data_dir))
    trained = seedflood.train(config, tmp_path / "run", quiet=True)
    replayed = seedflood.replay(tmp_path / "run")
    assert replayed.metrics["state_hash"] == trained.metrics["state_hash"]
    logits_ids = torch.tensor([[1, 17, 230, 4012]])
    with torch.no_grad():
        assert torch.equal(replayed.model(logits_ids).logits, trained.model(logits_ids).logits)

    grid = tmp_path / "grid.yaml"
    grid.write_text(
        json.dumps(
            {
                "common": {**TINY, "data_dir": str(data_dir)},
                "variants": {"seedflood": {}, "dsgd": {"method": "dsgd", "rounds": 1}},
            }
        )
    )
    first = seedflood.compare(grid, tmp_path / "cmp", quiet=True)
    assert sorted(first.runs) == ["dsgd", "seedflood"] and first.report.is_file()
    assert first.runs["seedflood"].metrics["state_hash"] == trained.metrics["state_hash"]
    before = (tmp_path / "cmp" / "runs" / "dsgd" / "results.json").stat().st_mtime_ns
    again = seedflood.compare(grid, tmp_path / "cmp", quiet=True)  # finished runs are read
    assert (tmp_path / "cmp" / "runs" / "dsgd" / "results.json").stat().st_mtime_ns == before
    assert again.runs["dsgd"].metrics == first.runs["dsgd"].metrics
