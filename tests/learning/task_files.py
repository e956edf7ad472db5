"""Tiny task data directories in the real GLUE/SuperGLUE jsonl layout, for the data-loading
tests: a schema-correct row per task and split, with one hand-written row per task whose MeZO
prompt is known."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from seedflood.learning.tasks import TASKS, Example

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


def write_task_tree(root: pathlib.Path) -> pathlib.Path:
    """Every task's files under ``root``, the known row first in each held-out file."""
    for task in TASKS:
        sizes = SST2_SIZES if task == "sst2" else SIZES
        held_out = "validation" if task == "sst2" else "val"
        for split, n in sizes.items():
            rows = [make_row(task, split, i) for i in range(n)]
            if split == held_out:
                rows[0] = KNOWN[task][0]
            write_jsonl(task_file(root, task, split), rows)
    return root
