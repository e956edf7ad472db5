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


@pytest.mark.parametrize("example", [0, 1], ids=["classification", "instruction"])
def test_the_readme_examples_train_and_export(
    example: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    rows, config = section_blocks()[example]
    monkeypatch.chdir(tmp_path)
    # 20 copies of each row shown: enough for 4 clients and a held-out fifth.
    Path(config["task"]["data"]).write_text("".join(json.dumps(r) + "\n" for r in rows * 20))
    Path("run.yaml").write_text(yaml.safe_dump(config))
    overrides = ["model=tiny", "rounds=2", "eval_every=2", "rank=8", "batch_size=2"]
    args = ["run", "run.yaml", "--out", "out", *[x for o in overrides for x in ("--set", o)]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads(Path("out/results.json").read_text())
    assert results["test_examples"] == 8 and results["task"] == Path(config["task"]["data"]).stem
    assert 0.0 <= results["accuracy"] <= 1.0 and results["eval_loss"] > 0
    if config["task"].get("objective") == "lm":
        assert results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]), rel=0.5)
    else:
        assert "perplexity" not in results
    model = AutoModelForCausalLM.from_pretrained("out/model")
    assert model.config.num_hidden_layers == 2  # the tiny model, trained and exported
    scored = CliRunner().invoke(app, ["evaluate", "out/model", "--config", "run.yaml"])
    assert scored.exit_code == 0, scored.output
    assert f"test accuracy {results['accuracy']:.4f}, loss {results['eval_loss']:.4f}" in (
        " ".join(scored.output.split())
    )
