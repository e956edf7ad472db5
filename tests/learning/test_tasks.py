"""Tests for seedflood.learning.tasks: MeZO-style prompts, the sampling protocol and the hub's
rows (bad data: test_bad_task_files.py; partitioning: test_partition.py). They read the tiny
directories of task_files.py; the real copy is only used when SEEDFLOOD_DATA_DIR points at it."""

from __future__ import annotations

import json
import pathlib
import sys
import types
from typing import Any

import pytest

from seedflood.learning.tasks import (
    TASKS,
    Example,
    TaskData,
    data_dir_from_env,
    load_task,
)
from tests.learning.task_files import KNOWN, SUPERGLUE, make_row, task_file, write_jsonl


def prompts(examples: list[Example]) -> set[str]:
    return {example.prompt for example in examples}


def test_sst2_carves_train_and_val_from_train_file_and_tests_on_validation(
    data_dir: pathlib.Path,
) -> None:
    data = load_task("sst2", data_dir=data_dir, n_train=20, n_val=10, n_test=100)
    assert (len(data.train), len(data.val), len(data.test)) == (20, 10, 6)
    assert len(prompts(data.train)) == 20
    assert not prompts(data.train) & prompts(data.val)
    assert all(p.startswith("train text") for p in prompts(data.train) | prompts(data.val))
    assert data.test[0] == KNOWN["sst2"][1]
    assert all(p.startswith("validation text") for p in prompts(data.test[1:]))
    assert data.source == f"data_dir:{data_dir}"
    assert len(data.notes) == 1
    assert "only 6 test examples" in data.notes[0]
    assert "instead of 100" in data.notes[0]


def test_sst2_val_gets_what_training_leaves(data_dir: pathlib.Path) -> None:
    data = load_task("sst2", data_dir=data_dir, n_train=30, n_val=20, n_test=6)
    assert (len(data.train), len(data.val)) == (30, 10)
    assert not prompts(data.train) & prompts(data.val)
    assert data.notes == [
        f"sst2: only 10 validation examples available from "
        f"{task_file(data_dir, 'sst2', 'train')} after taking 30 for training; "
        "using 10 instead of 20"
    ]


FULL_TRAINING_SETS = ("boolq", "rte")
"""Tasks whose shared train.jsonl holds more than FewGLUE's 32 rows (RTE: 2,490, BoolQ: 1,270):
n_train (1,024) examples are drawn from them, and validation from what training leaves."""


@pytest.mark.parametrize("task", FULL_TRAINING_SETS)
def test_full_size_training_files_give_validation_what_training_leaves(
    data_dir: pathlib.Path, task: str
) -> None:
    data = load_task(task, data_dir=data_dir, n_train=4, n_val=5, n_test=8)
    assert (len(data.train), len(data.val), len(data.test)) == (4, 2, 8)
    assert all(p.startswith("train text") for p in prompts(data.train) | prompts(data.val))
    assert not prompts(data.train) & prompts(data.val)
    assert not any("dev32 text" in p for p in prompts(data.train) | prompts(data.val))
    assert data.notes == [
        f"{task}: only 2 validation examples available from "
        f"{task_file(data_dir, task, 'train')} after taking 4 for training; using 2 instead of 5"
    ]


@pytest.mark.parametrize("task", sorted(set(SUPERGLUE) - set(FULL_TRAINING_SETS)))
def test_superglue_splits_come_from_train_dev32_val(data_dir: pathlib.Path, task: str) -> None:
    per_row = 2 if task == "multirc" else 1
    small = load_task(task, data_dir=data_dir, n_train=3, n_val=2, n_test=5)
    assert (len(small.train), len(small.val), len(small.test)) == (3, 2, 5)
    assert small.notes == []
    full = load_task(task, data_dir=data_dir)
    sizes = (len(full.train), len(full.val), len(full.test))
    assert sizes == (6 * per_row, 4 * per_row, 8 * per_row)
    assert all("train text" in p for p in prompts(full.train))
    assert all("dev32 text" in p for p in prompts(full.val))
    assert not any("train text" in p or "dev32 text" in p for p in prompts(full.test))
    train_note = (
        f"{task}: only {6 * per_row} training examples available from "
        f"{task_file(data_dir, task, 'train')}; using {6 * per_row} instead of 1024"
    )
    assert full.notes[0] == train_note
    assert [note.split(" examples")[0] for note in full.notes] == [
        f"{task}: only {6 * per_row} training",
        f"{task}: only {4 * per_row} validation",
        f"{task}: only {8 * per_row} test",
    ]


@pytest.mark.parametrize("task", TASKS)
def test_known_row_formats_as_mezo_template(data_dir: pathlib.Path, task: str) -> None:
    data = load_task(task, data_dir=data_dir, n_test=1000)
    assert data.test[0] == KNOWN[task][1]


def test_multirc_makes_one_example_per_answer(data_dir: pathlib.Path) -> None:
    first, second = load_task("multirc", data_dir=data_dir).test[:2]
    assert first.prompt.replace('"An apple"', '"A pear"') == second.prompt
    assert (first.label, second.label) == (1, 0)


def test_copa_conjunction_and_capitalisation(data_dir: pathlib.Path) -> None:
    row = {
        "premise": "I was tired.",
        "choice1": "I stayed up late.",
        "choice2": "Tom cooked dinner.",
        "question": "cause",
        "label": 0,
        "idx": 1,
    }
    write_jsonl(task_file(data_dir, "copa", "val"), [row])
    (example,) = load_task("copa", data_dir=data_dir).test
    assert example == Example(
        "I was tired because", (" I stayed up late.", " tom cooked dinner."), 0
    )


@pytest.mark.parametrize(
    ("task", "labels", "expected"),
    [
        ("rte", ["entailment", "not_entailment", 0, 1], [0, 1, 0, 1]),
        ("cb", ["entailment", "contradiction", "neutral", 2], [0, 1, 2, 2]),
        ("boolq", [True, False, 1, 0], [1, 0, 1, 0]),
    ],
)
def test_label_mapping(
    data_dir: pathlib.Path, task: str, labels: list[Any], expected: list[int]
) -> None:
    rows = [{**make_row(task, "val", i), "label": label} for i, label in enumerate(labels)]
    write_jsonl(task_file(data_dir, task, "val"), rows)
    assert [example.label for example in load_task(task, data_dir=data_dir).test] == expected


def test_sampling_is_deterministic_in_seed(data_dir: pathlib.Path) -> None:
    def draw(seed: int) -> TaskData:
        return load_task("sst2", data_dir=data_dir, seed=seed, n_train=10, n_val=5, n_test=3)

    assert draw(7) == draw(7)
    assert draw(7).train != draw(8).train
    assert draw(7).test != draw(8).test


def test_data_dir_from_env(monkeypatch: pytest.MonkeyPatch, data_dir: pathlib.Path) -> None:
    monkeypatch.delenv("SEEDFLOOD_DATA_DIR", raising=False)
    assert data_dir_from_env() is None
    monkeypatch.setenv("SEEDFLOOD_DATA_DIR", "")
    assert data_dir_from_env() is None
    monkeypatch.setenv("SEEDFLOOD_DATA_DIR", str(data_dir))
    assert data_dir_from_env() == data_dir
    assert load_task("rte").source == f"data_dir:{data_dir}"


def flat_hub_row(task: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The hub's spelling of a jsonl row: WSC spans at top level, MultiRC one row per answer."""
    if task == "wsc":
        return [{**{k: v for k, v in row.items() if k != "target"}, **row["target"]}]
    if task == "multirc":
        passage = row["passage"]
        return [
            {
                "paragraph": passage["text"],
                "question": question["question"],
                "answer": answer["text"],
                "label": answer["label"],
            }
            for question in passage["questions"]
            for answer in question["answers"]
        ]
    return [row]


@pytest.mark.parametrize("task", ["sst2", "wsc", "multirc"])
def test_hub_rows_go_through_the_same_converters(
    monkeypatch: pytest.MonkeyPatch, data_dir: pathlib.Path, task: str
) -> None:
    def hub_split(split: str) -> list[dict[str, Any]]:
        lines = task_file(data_dir, task, split).read_text(encoding="utf-8").splitlines()
        return [flat for line in lines for flat in flat_hub_row(task, json.loads(line))]

    held_out = "validation" if task == "sst2" else "val"
    splits = {"train": hub_split("train"), "validation": hub_split(held_out)}
    calls: list[tuple[str, ...]] = []
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda *name: calls.append(name) or splits  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.delenv("SEEDFLOOD_DATA_DIR", raising=False)

    hub = load_task(task, n_train=4, n_val=2, n_test=1000)
    expected_name = {"sst2": ("glue", "sst2"), "wsc": ("super_glue", "wsc.fixed")}
    assert calls == [expected_name.get(task, ("super_glue", task))]
    assert hub.source == f"hub:{'/'.join(calls[0])}"
    assert (len(hub.train), len(hub.val)) == (4, 2)
    assert not prompts(hub.train) & prompts(hub.val)
    assert all("train text" in p for p in prompts(hub.train) | prompts(hub.val))
    assert hub.test == load_task(task, data_dir=data_dir, n_test=1000).test


REAL_SIZES = {
    "sst2": (1024, 500, 872),
    "boolq": (1024, 246, 1000),  # validation: the 246 of 1,270 training rows left
    "rte": (1024, 500, 277),
    "wic": (32, 32, 638),
    "cb": (32, 32, 56),
    "copa": (32, 32, 100),
    "wsc": (32, 32, 104),
    "multirc": (154, 167, 1000),
}


@pytest.mark.skipif(
    data_dir_from_env() is None,
    reason="SEEDFLOOD_DATA_DIR not set: real SST-2/SuperGLUE data unavailable",
)
@pytest.mark.parametrize("task", TASKS)
def test_real_data(task: str) -> None:
    data = load_task(task, seed=0)
    assert (len(data.train), len(data.val), len(data.test)) == REAL_SIZES[task]
    assert data.source == f"data_dir:{data_dir_from_env()}"
    examples = data.train + data.val + data.test
    assert all(0 <= e.label < len(e.candidates) for e in examples)
    assert {len(e.candidates) for e in examples} == {3 if task == "cb" else 2}
    if task == "sst2":
        assert data.notes == [
            f"sst2: only 872 test examples available from "
            f"{data_dir_from_env() / 'sst2' / 'validation.jsonl'}; using 872 instead of 1000"
        ]
    elif task in FULL_TRAINING_SETS:
        assert not any("training examples" in note for note in data.notes)
        assert not prompts(data.train) & prompts(data.val)
        assert not prompts(data.train + data.val) & prompts(data.test)
    else:
        assert "training examples" in data.notes[0]
        assert not prompts(data.train) & prompts(data.test)
