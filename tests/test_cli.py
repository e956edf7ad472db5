"""`seedflood run` end to end with the tiny model on a small SST-2-shaped data directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.files import read_jsonl
from seedflood.protocol.messages import Message, encode_packet


@pytest.fixture(scope="module")
def ring_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("run")
    overrides = [
        "model=tiny",
        f"data_dir={data_dir}",
        "clients=16",
        "topology=ring",
        "rounds=20",
        "rank=16",
        "batch_size=2",
        "n_train=64",
        "n_val=32",
        "n_test=40",
        "eval_every=5",
    ]
    args = ["run", "configs/quickstart.yaml", "--out", str(out)]
    for override in overrides:
        args += ["--set", override]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "zero-shot test accuracy" in result.output
    assert "final test accuracy" in result.output
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_ring_run_reaches_exact_consensus(ring_run: tuple[Path, dict]) -> None:
    _, results = ring_run
    assert results["consensus_distance"] == 0.0
    assert results["client_accuracy_mean"] == results["accuracy"]
    assert (results["clients"], results["rounds"], results["hops"]) == (16, 20, 8)
    assert results["messages_total"] == 16 * 20
    for key in ("accuracy", "bytes_per_edge_mean", "wall_seconds", "peak_rss_mb"):
        assert results[key] > 0
    assert results["config"]["model"] == "tiny"
    assert (results["device"], results["peak_device_mb"]) == ("cpu", None)
    assert results["majority_accuracy"] == 0.5  # the 40 test sentences alternate labels


def test_bytes_per_edge_are_what_the_codec_sent(ring_run: tuple[Path, dict]) -> None:
    """On an even ring each edge carries every message of every step exactly once, one packet per
    message when hops = diameter: 16 packets per step per edge."""
    _, results = ring_run
    sizes = [
        len(encode_packet([Message(step, origin, 0.0)]))
        for step in range(20)
        for origin in range(16)
    ]
    assert results["messages_per_edge_max"] == results["messages_per_edge_mean"] == 16 * 20
    assert results["bytes_per_edge_max"] == results["bytes_per_edge_mean"] == sum(sizes)
    header = results["header_bytes_per_edge_max"]
    assert header == sum(sizes) - 4 * 16 * 20
    assert results["bytes_per_edge_max"] <= 5 * results["messages_per_edge_max"] + header


def test_history_has_one_line_per_evaluation(ring_run: tuple[Path, dict]) -> None:
    out, _ = ring_run
    history = read_jsonl(out / "history.jsonl")
    assert [h["round"] for h in history] == [0, 5, 10, 15, 20]
    assert all(h["consensus_distance"] == 0.0 for h in history)
    assert history[-1]["messages_per_edge_max"] == 16 * 20
    assert history[1]["train_loss"] > 0


def test_bad_config_value_exits_with_a_clear_message() -> None:
    result = CliRunner().invoke(
        app, ["run", "configs/quickstart.yaml", "--set", "topology=hexagon"]
    )
    assert result.exit_code == 2
    assert "key 'topology'" in result.output and "'ring'" in result.output
