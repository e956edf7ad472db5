"""The untrained model's score is read back only for the exact parameters and examples scored."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from seedflood.config import load_config
from seedflood.learning import accuracy_cache
from seedflood.learning.accuracy_cache import cached_accuracy
from seedflood.learning.models import load_model
from seedflood.learning.scoring import accuracy, tokenize
from seedflood.learning.tasks import Example
from seedflood.sim.runner import run

WORDS = ["good", "bad", "fine", "awful", "great", "poor"]


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny", seed=0)
    examples = [
        Example(f"It was {WORDS[k % 6]} and {WORDS[(k * 5) % 6]}. It was", (" bad", " good"), k % 2)
        for k in range(24)
    ]
    return model, tokenize(tokenizer, examples, 32), tokenizer.pad_token_id


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """An empty cache, and the number of real evaluations made through it."""
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "cache"))
    calls: list[int] = []

    def counting_accuracy(*args, **kwargs) -> float:
        calls.append(1)
        return accuracy(*args, **kwargs)

    monkeypatch.setattr(accuracy_cache, "accuracy", counting_accuracy)
    return calls


def test_a_second_scoring_reads_the_first_back(tiny, counted: list[int]) -> None:
    model, examples, pad_id = tiny
    first = cached_accuracy(model, examples, pad_id, 8)
    assert first == accuracy(model, examples, pad_id, 8)
    assert cached_accuracy(model, examples, pad_id, 8) == first
    assert len(counted) == 1


def test_changed_parameters_examples_or_batching_are_scored_again(tiny, counted) -> None:
    model, examples, pad_id = tiny
    cached_accuracy(model, examples, pad_id, 8)
    nudged = copy.deepcopy(model)
    with torch.no_grad():
        next(nudged.parameters()).view(-1)[0] += 1e-3
    cached_accuracy(nudged, examples, pad_id, 8)
    cached_accuracy(model, examples[:-1], pad_id, 8)
    cached_accuracy(model, examples, pad_id, 4)
    assert len(counted) == 4


def test_an_unreadable_entry_is_scored_again(tiny, counted, tmp_path: Path) -> None:
    model, examples, pad_id = tiny
    score = cached_accuracy(model, examples, pad_id, 8)
    (entry,) = (tmp_path / "cache" / "accuracy").iterdir()
    entry.write_text("{truncated")
    assert cached_accuracy(model, examples, pad_id, 8) == score
    assert len(counted) == 2


@pytest.mark.slow
def test_runs_sharing_a_start_and_test_set_score_it_once(
    data_dir: Path, tmp_path: Path, counted: list[int]
) -> None:
    """SeedFlood on a ring and on a meshgrid starts from the same model and test set: the
    zero-shot score is evaluated for the first run only and is the same number in both."""
    common = [
        "model=tiny",
        f"data_dir={data_dir}",
        "clients=4",
        "rounds=1",
        "eval_every=1",
        "batch_size=2",
        "n_train=16",
        "n_val=8",
        "n_test=12",
    ]
    runs = {
        name: run(load_config("configs/quickstart.yaml", [*common, *extra]), tmp_path / name)
        for name, extra in {
            "seedflood-ring": ["topology=ring"],
            "seedflood-meshgrid": ["topology=meshgrid"],
        }.items()
    }
    assert (
        runs["seedflood-ring"]["zero_shot_accuracy"]
        == (runs["seedflood-meshgrid"]["zero_shot_accuracy"])
    )
    assert len(counted) == 1
