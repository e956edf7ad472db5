"""README's "Fine-tune your own model on your own data" runs as written: its two configs (with the
tiny model and a few rounds) train on rows shaped like its jsonl examples, and the exported model
loads with transformers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import load_config
from seedflood.sim.replay import evaluate

README = Path(__file__).resolve().parents[1] / "README.md"


def section_blocks() -> list[tuple[list[dict], dict]]:
    """The section's (jsonl rows, yaml config) pairs, in order."""
    text = README.read_text()
    section = text.split("## Fine-tune your own model on your own data")[1].split("\n## ")[0]
    blocks = re.findall(r"```(jsonl|yaml)\n(.*?)```", section, re.S)
    rows = [
        [json.loads(line) for line in body.splitlines()] for kind, body in blocks if kind == "jsonl"
    ]
    configs = [yaml.safe_load(body) for kind, body in blocks if kind == "yaml"]
    assert len(rows) == len(configs) == 2
    return list(zip(rows, configs, strict=True))


def run_tiny(rows: list[dict], config: dict) -> dict:
    """The config with the tiny model for 2 rounds, in the current directory, on 20 copies of
    each row shown (enough for 4 clients and held-out shares); its results."""
    Path(config["task"]["data"]).write_text("".join(json.dumps(r) + "\n" for r in rows * 20))
    Path("run.yaml").write_text(yaml.safe_dump(config))
    overrides = ["model=tiny", "rounds=2", "eval_every=2", "rank=8", "batch_size=2"]
    args = ["run", "run.yaml", "--out", "out", *[x for o in overrides for x in ("--set", o)]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(Path("out/results.json").read_text())


@pytest.mark.parametrize("example", [0, 1], ids=["classification", "instruction"])
@pytest.mark.slow
def test_the_readme_examples_train_and_export(
    example: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    rows, config = section_blocks()[example]
    monkeypatch.chdir(tmp_path)
    results = run_tiny(rows, config)
    assert results["test_examples"] == 8 and results["task"] == Path(config["task"]["data"]).stem
    assert 0.0 <= results["accuracy"] <= 1.0 and results["eval_loss"] > 0
    if config["task"].get("objective") == "lm":
        assert results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]), rel=0.5)
    else:
        assert "perplexity" not in results
    model = AutoModelForCausalLM.from_pretrained("out/model")
    assert model.config.num_hidden_layers == 2  # the tiny model, trained and exported
    command = CliRunner().invoke(app, ["evaluate", "out/model", "--config", "run.yaml"])
    assert command.exit_code == 0, command.output
    scored = evaluate("out/model", load_config("run.yaml"))  # what that command prints
    assert scored["accuracy"] == results["accuracy"]
    assert scored["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-6)


def test_eval_generate_writes_what_greedy_decoding_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    """Generating with transformers agrees with the one-forward exact match, row by row."""
    rows, config = section_blocks()[1]
    monkeypatch.chdir(tmp_path)
    results = run_tiny(rows, {**config, "task": {**config["task"], "eval_generate": True}})
    generations = [
        json.loads(line) for line in Path("out/generations.jsonl").read_text().splitlines()
    ]
    assert len(generations) == results["test_examples"] == 8
    assert results["generated_exact_match"] == results["accuracy"]
    assert {row["expected"] for row in generations} <= {" positive", " negative"}
