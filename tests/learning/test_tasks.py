"""Tests for seedflood.learning.tasks: MeZO-style prompts, the sampling protocol, data validation
and client partitioning. Tiny data directories in the real GLUE/SuperGLUE jsonl schema are written
to tmp_path; the real copy is only used when SEEDFLOOD_DATA_DIR points at it."""

from __future__ import annotations

import json
import pathlib
import sys
import types
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.learning.tasks import (
    TASKS,
    DataError,
    Example,
    TaskData,
    data_dir_from_env,
    load_task,
    partition,
)

SUPERGLUE = {
    "boolq": "BoolQ",
    "rte": "RTE",
    "wic": "WiC",
    "cb": "CB",
    "copa": "COPA",
    "wsc": "WSC",
    "multirc": "MultiRC",
}

# One hand-written row per task, placed first in the held-out file, with the Example MeZO's
# template makes of it.
KNOWN: dict[str, tuple[dict[str, Any], Example]] = {
    "sst2": (
        {"idx": 0, "sentence": "a gorgeous , witty film ", "label": 1},
        Example("a gorgeous , witty film It was", (" terrible", " great"), 1),
    ),
    "boolq": (
        {
            "question": "is the sky blue",
            "passage": "Sky -- The sky is blue.",
            "idx": 0,
            "label": True,
        },
        Example("Sky -- The sky is blue. is the sky blue?\n", ("No", "Yes"), 1),
    ),
    "rte": (
        {"premise": "A cat sat.", "hypothesis": "An animal sat.", "label": "entailment", "idx": 0},
        Example(
            'A cat sat.\nDoes this mean that "An animal sat." is true? Yes or No?\n',
            ("Yes", "No"),
            0,
        ),
    ),
    "cb": (
        {"premise": "It rained.", "hypothesis": "It was dry", "label": "neutral", "idx": 0},
        Example(
            'Suppose It rained. Can we infer that "It was dry"? Yes, No, or Maybe?\n',
            ("Yes", "No", "Maybe"),
            2,
        ),
    ),
    "wic": (
        {
            "word": "bank",
            "sentence1": "He sat on the bank.",
            "sentence2": "She robbed the bank.",
            "idx": 0,
            "label": False,
            "start1": 14,
            "start2": 15,
            "end1": 18,
            "end2": 19,
            "version": 1.1,
        },
        Example(
            'Does the word "bank" have the same meaning in these two sentences? Yes, No?\n'
            "He sat on the bank.\nShe robbed the bank.\n",
            ("No", "Yes"),
            0,
        ),
    ),
    "copa": (
        {
            "premise": "The man turned on the faucet.",
            "choice1": "The toilet filled with water.",
            "choice2": "Water flowed from the spout.",
            "question": "effect",
            "label": 1,
            "idx": 0,
        },
        Example(
            "The man turned on the faucet so",
            (" the toilet filled with water.", " water flowed from the spout."),
            1,
        ),
    ),
    "wsc": (
        {
            "text": "Mark told Pete lies about himself. He deserved it.",
            "target": {
                "span2_index": 6,
                "span1_index": 2,
                "span1_text": "Pete",
                "span2_text": "He",
            },
            "idx": 0,
            "label": True,
        },
        Example(
            "Mark told Pete lies about himself. He deserved it.\nIn the previous sentence, does "
            'the pronoun "he" refer to Pete? Yes or No?\n',
            ("No", "Yes"),
            1,
        ),
    ),
    "multirc": (
        {
            "idx": 0,
            "version": 1.1,
            "passage": {
                "text": "Sam ate an apple.",
                "questions": [
                    {
                        "question": "What did Sam eat?",
                        "idx": 0,
                        "answers": [
                            {"text": "An apple", "idx": 0, "label": 1},
                            {"text": "A pear", "idx": 1, "label": 0},
                        ],
                    }
                ],
            },
        },
        Example(
            'Sam ate an apple.\nQuestion: What did Sam eat?\nI found this answer "An apple". '
            "Is that correct? Yes or No?\n",
            ("No", "Yes"),
            1,
        ),
    ),
}


def make_row(task: str, tag: str, i: int) -> dict[str, Any]:
    """A schema-correct row whose text carries `tag` so tests can tell which file it came from."""
    text, flag = f"{tag} text {i}.", i % 2 == 1
    rows: dict[str, dict[str, Any]] = {
        "sst2": {"idx": i, "sentence": text, "label": int(flag)},
        "boolq": {"question": f"{tag} q {i}", "passage": text, "idx": i, "label": flag},
        "rte": {
            "premise": text,
            "hypothesis": "h",
            "label": ["entailment", "not_entailment"][i % 2],
            "idx": i,
        },
        "cb": {
            "premise": text,
            "hypothesis": "h",
            "label": ["entailment", "contradiction", "neutral"][i % 3],
            "idx": i,
        },
        "wic": {"word": "w", "sentence1": text, "sentence2": "s", "idx": i, "label": flag},
        "copa": {
            "premise": text,
            "choice1": f"{tag} a {i}",
            "choice2": "B",
            "question": "cause",
            "label": i % 2,
            "idx": i,
        },
        "wsc": {
            "text": text,
            "target": {"span1_text": "x", "span2_text": "It", "span1_index": 0, "span2_index": 1},
            "idx": i,
            "label": flag,
        },
        "multirc": {
            "idx": i,
            "passage": {
                "text": text,
                "questions": [
                    {
                        "question": "q",
                        "idx": i,
                        "answers": [
                            {"text": "a", "idx": 0, "label": 0},
                            {"text": "b", "idx": 1, "label": 1},
                        ],
                    }
                ],
            },
        },
    }
    return rows[task]


def write_jsonl(path: pathlib.Path, rows: list[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def task_file(root: pathlib.Path, task: str, split: str) -> pathlib.Path:
    folder = "sst2" if task == "sst2" else f"superglue/{SUPERGLUE[task]}"
    return root / folder / f"{split}.jsonl"


# Rows per file; MultiRC rows are passages with two answers each, so twice as many examples.
SIZES = {"train": 6, "dev32": 4, "val": 8}
SST2_SIZES = {"train": 40, "validation": 6}


@pytest.fixture
def data_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    for task in TASKS:
        sizes = SST2_SIZES if task == "sst2" else SIZES
        held_out = "validation" if task == "sst2" else "val"
        for split, n in sizes.items():
            rows = [make_row(task, split, i) for i in range(n)]
            if split == held_out:
                rows[0] = KNOWN[task][0]
            write_jsonl(task_file(tmp_path, task, split), rows)
    return tmp_path


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


def test_hub_failure_says_how_to_get_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEEDFLOOD_DATA_DIR", raising=False)
    fake = types.ModuleType("datasets")

    def offline(*name: str) -> None:
        raise ConnectionError("no network")

    fake.load_dataset = offline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(DataError, match=r"no network.*SEEDFLOOD_DATA_DIR.*install `datasets`"):
        load_task("rte")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match=r"not installed.*SEEDFLOOD_DATA_DIR"):
        load_task("rte")


def test_missing_directory_and_file(data_dir: pathlib.Path) -> None:
    with pytest.raises(DataError, match=r"nowhere does not exist; expected layout"):
        load_task("rte", data_dir=data_dir / "nowhere")
    path = task_file(data_dir, "cb", "dev32")
    path.unlink()
    with pytest.raises(DataError, match=rf"{path} not found; expected layout.*superglue/<Task>"):
        load_task("cb", data_dir=data_dir)


@pytest.mark.parametrize(
    ("task", "lines", "message"),
    [
        ("rte", ['{"premise": "p"', "{}"], r"line 1: not valid JSON"),
        ("rte", [json.dumps(make_row("rte", "t", 0)), "", "{oops"], r"line 3: not valid JSON"),
        (
            "rte",
            [json.dumps({"premise": "p", "label": "entailment"})],
            r"missing column 'hypothesis'",
        ),
        (
            "rte",
            [
                json.dumps(make_row("rte", "t", 0)),
                json.dumps({**make_row("rte", "t", 1), "label": "maybe"}),
            ],
            r"line 2: column 'label' has value 'maybe'; allowed: 0, 1, false, true, "
            r"'entailment', 'not_entailment'",
        ),
        (
            "cb",
            [json.dumps({**make_row("cb", "t", 0), "label": True})],
            r"value True; allowed: 0, 1, 2,",
        ),
        (
            "sst2",
            [json.dumps({"idx": 0, "sentence": "s", "label": 2})],
            r"value 2; allowed: 0, 1, false",
        ),
        (
            "copa",
            [json.dumps({**make_row("copa", "t", 0), "question": "why"})],
            r"'question'.*'why'",
        ),
        (
            "wsc",
            [json.dumps({**make_row("wsc", "t", 0), "target": {"span1_text": "x"}})],
            r"'span2_text'",
        ),
        (
            "multirc",
            [json.dumps({"idx": 0, "passage": {"text": "t"}})],
            r"missing column 'questions'",
        ),
        ("boolq", ["[1, 2]"], r"line 1: expected a JSON object"),
        (
            "wic",
            [json.dumps({**make_row("wic", "t", 0), "word": 5})],
            r"column 'word' must be a str",
        ),
        ("rte", [], r"contains no examples: it needs one JSON object per line"),
        ("rte", ["", "   "], r"contains no examples"),
        ("sst2", ['{"sentence": "caf\udce9", "label": 1}'], r"line 1: not UTF-8 text"),
        ("sst2", ["[" * 100_000], r"line 1: not valid JSON \(maximum recursion depth"),
        ("sst2", ['{"sentence": "s", "label": ' + "1" * 5000 + "}"], r"not valid JSON.*4300"),
        ("sst2", ['{"sentence": "s", "label": 1}', "null"], r"line 2: expected a JSON object"),
        ("sst2", ['{"sentence": "s", "label": [1]}'], r"value \[1\]; allowed: 0, 1, false"),
        ("sst2", ['{"sentence": "s", "label": 1.0}'], r"value 1.0; allowed: 0, 1, false"),
        ("sst2", ['{"sentence": "s", "label": -1}'], r"value -1; allowed: 0, 1, false"),
        ("sst2", ['{"sentence": null, "label": 0}'], r"'sentence' must be a str, got None"),
    ],
)
def test_bad_rows_name_file_line_and_problem(
    data_dir: pathlib.Path, task: str, lines: list[str], message: str
) -> None:
    path = task_file(data_dir, task, "train")
    # surrogateescape: a lone "\udce9" in a line becomes the byte 0xE9, which is not UTF-8.
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    with pytest.raises(DataError, match=message) as info:
        load_task(task, data_dir=data_dir)
    assert str(info.value).startswith(str(path))


def test_bad_arguments(data_dir: pathlib.Path) -> None:
    with pytest.raises(DataError, match=r"unknown task 'mnli'; allowed: sst2, boolq, rte, wic"):
        load_task("mnli", data_dir=data_dir)
    for name in ("n_train", "n_val", "n_test"):
        with pytest.raises(DataError, match=rf"{name} must be >= 1, got 0"):
            load_task("rte", data_dir=data_dir, **{name: 0})


def labelled(n: int, n_classes: int = 2) -> list[Example]:
    return [Example(f"p{i}", ("a", "b", "c")[:n_classes], i % n_classes) for i in range(n)]


def test_uniform_partition_is_balanced_exact_and_deterministic() -> None:
    examples = labelled(10)
    shards = partition(examples, 3, seed=1)
    assert sorted(len(shard) for shard in shards) == [3, 3, 4]
    assert Counter(e for shard in shards for e in shard) == Counter(examples)
    assert partition(examples, 3, seed=1) == shards
    assert partition(examples, 3, seed=2) != shards


def max_class_fraction(shards: list[list[Example]]) -> float:
    return float(np.mean([max(Counter(e.label for e in s).values()) / len(s) for s in shards]))


def test_dirichlet_partition_skews_labels_and_feeds_every_client() -> None:
    examples = labelled(400, n_classes=2)
    skewed = partition(examples, 8, seed=0, scheme="dirichlet", alpha=0.1)
    uniform = partition(examples, 8, seed=0)
    assert all(skewed)
    assert Counter(e for shard in skewed for e in shard) == Counter(examples)
    assert max_class_fraction(skewed) > 0.8
    assert max_class_fraction(uniform) < 0.65
    assert partition(examples, 8, seed=0, scheme="dirichlet", alpha=0.1) == skewed


def test_dirichlet_with_one_example_per_client() -> None:
    examples = labelled(6, n_classes=3)
    shards = partition(examples, 6, scheme="dirichlet", alpha=0.01)
    assert sorted(len(shard) for shard in shards) == [1] * 6
    assert Counter(e for shard in shards for e in shard) == Counter(examples)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    data=st.data(),
    scheme=st.sampled_from(["uniform", "dirichlet"]),
    alpha=st.floats(0.01, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_partition_uses_every_example_once(
    n: int, data: st.DataObject, scheme: str, alpha: float, seed: int
) -> None:
    n_clients = data.draw(st.integers(1, n))
    examples = labelled(n, n_classes=3)
    shards = partition(examples, n_clients, seed=seed, scheme=scheme, alpha=alpha)
    assert len(shards) == n_clients
    assert all(shards)
    assert Counter(e for shard in shards for e in shard) == Counter(examples)
    if scheme == "uniform":
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_partition_errors() -> None:
    with pytest.raises(
        DataError,
        match=r"^16 clients but only 8 training examples: every client needs one; use fewer",
    ):
        partition(labelled(8), 16)
    with pytest.raises(
        DataError, match=r"unknown partition scheme 'iid'; allowed: uniform, dirichlet"
    ):
        partition(labelled(8), 2, scheme="iid")
    with pytest.raises(DataError, match=r"alpha must be > 0, got 0"):
        partition(labelled(8), 2, scheme="dirichlet", alpha=0.0)
    with pytest.raises(DataError, match=r"n_clients must be >= 1, got 0"):
        partition(labelled(8), 0)


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


def test_byte_order_mark_and_blank_lines_are_accepted(data_dir: pathlib.Path) -> None:
    path = task_file(data_dir, "sst2", "train")
    rows = [{"sentence": f"s{i}", "label": i % 2} for i in range(3)]
    text = "\n\n".join(json.dumps(row) for row in rows)
    path.write_bytes(b"\xef\xbb\xbf" + text.encode() + b"\r\n")
    data = load_task("sst2", data_dir=data_dir, n_train=3, n_val=1)
    assert sorted(e.prompt for e in data.train + data.val) == [
        "s0 It was",
        "s1 It was",
        "s2 It was",
    ]


def test_a_file_for_the_directory_or_a_directory_for_the_file(data_dir: pathlib.Path) -> None:
    not_a_dir = data_dir / "sst2" / "train.jsonl"
    with pytest.raises(DataError, match=r"train.jsonl is a file, not a directory; expected"):
        load_task("sst2", data_dir=not_a_dir)
    path = task_file(data_dir, "sst2", "validation")
    path.unlink()
    path.mkdir()
    with pytest.raises(DataError, match=rf"{path} not found; expected layout"):
        load_task("sst2", data_dir=data_dir)
