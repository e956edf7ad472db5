"""Bad data for seedflood.learning.tasks: missing or misplaced files, malformed rows, bad
arguments and an unreachable hub each give a DataError naming what was wrong and what is
allowed."""

from __future__ import annotations

import json
import pathlib
import sys
import types

import pytest

from seedflood.learning.tasks import DataError, load_task
from tests.learning.task_files import make_row, task_file


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
