"""A user's own data through `datasets`: jsonl, csv and parquet files and folders, templates over
their fields, a held-out share, the language-modelling objective, and errors that name the file,
row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from seedflood.config import ConfigError, load_config
from seedflood.learning.tasks import DataError, Example, TaskSpec, load_task

REVIEWS = [
    {"text": f"review {i} was {'fine' if i % 2 else 'awful'}", "label": i % 2} for i in range(40)
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def classify(data: Path | str, **extra) -> TaskSpec:
    spec = {"template": "{text} It was", "labels": [" terrible", " great"], **extra}
    return TaskSpec(data=str(data), **spec)


def test_a_jsonl_file_with_a_held_out_share(tmp_path: Path) -> None:
    spec = classify(write_jsonl(tmp_path / "reviews.jsonl", REVIEWS), test_fraction=0.25)
    data = load_task(spec, seed=3, n_train=20, n_val=5, n_test=1000)
    assert data.task == "reviews" and data.objective == "classify"
    # 10 rows held out for testing, then a tenth of the other 30 (3) for validation.
    assert (len(data.train), len(data.val), len(data.test)) == (20, 3, 10)
    assert data.test[0] in {
        Example(f"{row['text']} It was", (" terrible", " great"), row["label"]) for row in REVIEWS
    }
    prompts = [{e.prompt for e in split} for split in (data.train, data.val, data.test)]
    assert not (prompts[0] & prompts[1]) and not (prompts[0] | prompts[1]) & prompts[2]
    # The held-out rows do not move with the run's seed; the training draw does.
    again = load_task(spec, seed=4, n_train=20, n_val=5, n_test=1000)
    assert again.test == data.test and again.train != data.train


def test_a_folder_of_splits_csv_and_parquet_read_alike(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", REVIEWS[:30])
    write_jsonl(folder / "test.jsonl", REVIEWS[30:])
    from_folder = load_task(classify(folder, name="mine"), n_test=1000)
    assert from_folder.task == "mine" and len(from_folder.test) == 10
    frame = pandas.DataFrame(REVIEWS)
    frame.to_csv(tmp_path / "reviews.csv", index=False)
    frame.to_parquet(tmp_path / "reviews.parquet")
    tests = [
        load_task(classify(tmp_path / f"reviews.{kind}", test_fraction=0.25), n_test=1000).test
        for kind in ("csv", "parquet")
    ]
    jsonl = write_jsonl(tmp_path / "reviews.jsonl", REVIEWS)
    assert tests[0] == tests[1] == load_task(classify(jsonl, test_fraction=0.25)).test


def test_string_labels_through_label_names(tmp_path: Path) -> None:
    rows = [{"text": "t", "sentiment": name} for name in ("pos", "neg", "pos") * 2]
    spec = classify(
        write_jsonl(tmp_path / "r.jsonl", rows),
        label_field="sentiment",
        label_names=["neg", "pos"],
        test_fraction=0.34,
    )
    data = load_task(spec, n_train=10, n_val=1)
    assert sorted(e.label for e in data.train + data.val + data.test) == [0, 0, 1, 1, 1, 1]


def test_instruction_data_is_prompt_and_completion(tmp_path: Path) -> None:
    rows = [{"q": f"2+{i}=", "a": str(2 + i)} for i in range(10)]
    spec = TaskSpec(
        data=str(write_jsonl(tmp_path / "math.jsonl", rows)),
        objective="lm",
        prompt_template="Q: {q}\nA:",
        completion_template=" {a}",
        test_fraction=0.2,
    )
    data = load_task(spec, n_train=6, n_val=2)
    assert data.objective == "lm" and len(data.test) == 2
    assert all(e.label == 0 and len(e.candidates) == 1 for e in data.train)
    assert Example("Q: 2+3=\nA:", (" 5",), 0) in data.train + data.val + data.test


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{"text": "a", "label": 0}, {"txt": "b", "label": 1}],
            # datasets fills a column a row lacks with null
            r"r.jsonl \(train split\), row 2: column 'text' must be a str, got None",
        ),
        ([{"text": "a", "label": 5}], r"row 1: column 'label' has value 5; allowed: 0, 1"),
        ([{"text": 3, "label": 0}], r"row 1: column 'text' must be a str, got 3"),
    ],
)
def test_bad_rows_name_the_file_row_and_field(tmp_path: Path, rows: list, message: str) -> None:
    spec = classify(write_jsonl(tmp_path / "r.jsonl", rows), test_fraction=0.5)
    with pytest.raises(DataError, match=message):
        load_task(spec)


def test_missing_data_and_splits_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nowhere.jsonl not found"):
        load_task(classify(tmp_path / "nowhere.jsonl", test_fraction=0.5))
    one_file = classify(write_jsonl(tmp_path / "r.jsonl", REVIEWS))
    with pytest.raises(DataError, match=r"has no split test: test; it has: train; a single file"):
        load_task(one_file)
    (tmp_path / "r.txt").write_text("hello\n")
    with pytest.raises(DataError, match=r"unknown file type '.txt'; allowed: .jsonl"):
        load_task(classify(tmp_path / "r.txt", test_fraction=0.5))


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            {"data": "r.jsonl", "template": "{t}", "labels": ["a", "b"], "test_fraction": 0.1}
            | {"split": {"train": "train", "test": "test"}},
            "exactly one of",
        ),
        (
            {
                "data": "r.jsonl",
                "template": "{text.upper}",
                "labels": ["a", "b"],
                "test_fraction": 0.1,
            },
            r"field \{text.upper\} must name a column",
        ),
        (
            {"data": "r.jsonl", "template": "{text", "labels": ["a", "b"], "test_fraction": 0.1},
            r"template '\{text'",
        ),
        (
            {"data": "r.jsonl", "template": "{text}", "test_fraction": 0.1},
            "takes template and labels",
        ),
        (
            {"data": "r.jsonl", "objective": "lm", "template": "{t}", "test_fraction": 0.1},
            "prompt_template and completion_template",
        ),
        (
            {
                "data": "r.jsonl",
                "template": "{t}",
                "labels": ["a", "b"],
                "label_names": ["x"],
                "test_fraction": 0.1,
            },
            "label_names has 1 names for 2 labels",
        ),
        ({"data": "r.jsonl", "tempalte": "{t}"}, "tempalte"),
    ],
)
def test_a_task_mapping_that_cannot_work_is_refused_at_config_time(
    task: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, values={"task": task})
    with pytest.raises(ValidationError):
        TaskSpec(**task)
