"""What every task becomes: prompt-plus-candidates examples, and the errors that name bad data.

A classification example is scored by the model's likelihood of each candidate continuation after
the prompt (MeZO's protocol); a language-modelling example has one candidate, its completion, and
is scored by that completion's likelihood alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

Objective = Literal["classify", "lm"]


class DataError(ValueError):
    """Task data is missing or malformed; the message says where and what is allowed."""


class RowError(Exception):
    """A problem inside one row; the reader adds the file and row it came from."""


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str  # text up to the answer; a candidate's leading space stays with the candidate
    candidates: tuple[
        str, ...
    ]  # one continuation per class (COPA: per example); lm: the completion
    label: int  # index into candidates


@dataclass(frozen=True)
class TaskData:
    task: str
    train: list[Example]
    val: list[Example]
    test: list[Example]
    notes: list[str]  # deviations from the requested protocol, e.g. too few rows
    source: str  # "data_dir:<path>", "hub:<dataset>" or "file:<path>"
    objective: Objective = "classify"

    def identity(self) -> dict[str, int | str]:
        """What a run trains and is scored on: the example counts and a digest of the examples
        in order. Two runs of one config on other data files (32 training rows, then 2,490) are
        different runs; `seedflood compare` reads this to tell them apart."""
        digest = hashlib.sha256()
        for split in (self.train, self.val, self.test):
            for example in split:
                row = [example.prompt, list(example.candidates), example.label]
                digest.update(json.dumps(row, ensure_ascii=False).encode())
                digest.update(b"\n")
            digest.update(b"\x00")
        counts = {"train": len(self.train), "val": len(self.val), "test": len(self.test)}
        return {**counts, "sha256": digest.hexdigest()}
