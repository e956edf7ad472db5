"""A user's own task: any file, folder or hub dataset that `datasets` reads, turned into examples
by templates over its rows (seedflood.learning.templates).

The ``task`` key of a run config takes this mapping in place of a built-in name:

    task:
      data: reviews.jsonl          # jsonl/json/csv/parquet file or folder, or a hub dataset id
      split: {train: train, test: test}   # or carve the test set with test_fraction
                                   # (validation: a split, or validation_fraction of train, 0.1)
      template: "{text} It was"    # classification: a prompt ...
      labels: [" terrible", " great"]     # ... and one candidate per class
      label_field: label           # ints, or strings listed in label_names

or, for instruction data, ``objective: lm`` with ``prompt_template`` and ``completion_template``.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seedflood.learning.examples import DataError, Example, Objective, RowError
from seedflood.learning.templates import Template, template_fields

SPLIT_DEFAULT = {"train": "train", "test": "test"}
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
TEST_CARVE_SEED = 0
"""The rows test_fraction (and validation_fraction) hold out are the same for every run seed, so
seeds are compared on the same rows."""


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    data: str = Field(min_length=1)
    name: str | None = None
    split: dict[Literal["train", "validation", "test"], str] | None = None
    test_fraction: float | None = Field(None, gt=0, lt=1)
    validation_fraction: float = Field(0.1, gt=0, lt=1)
    objective: Literal["classify", "lm"] = "classify"
    template: str | None = None
    labels: tuple[str, ...] | None = None
    label_field: str = "label"
    label_names: tuple[str, ...] = ()
    prompt_template: str | None = None
    completion_template: str | None = None
    eval_generate: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        if self.split is not None and "train" not in self.split:
            raise ValueError("task split needs a 'train' entry naming the training split")
        if ("test" in self.split_names) == (self.test_fraction is not None):
            raise ValueError(
                "task needs exactly one of split.test (the test split's name) and "
                "test_fraction (the share of the training rows held out for testing)"
            )
        if self.objective == "lm":
            wrong = [k for k in ("template", "labels") if getattr(self, k) is not None]
            if wrong or self.prompt_template is None or self.completion_template is None:
                raise ValueError(
                    "task with objective lm takes prompt_template and completion_template "
                    f"(not template or labels){'; got ' + ', '.join(wrong) if wrong else ''}"
                )
        else:
            if self.template is None or self.labels is None or len(self.labels) < 2:
                raise ValueError(
                    "a classification task takes template and labels (two or more candidate "
                    "continuations); for prompt → completion data set objective: lm"
                )
            if self.label_names and len(self.label_names) != len(self.labels):
                raise ValueError(
                    f"task label_names has {len(self.label_names)} names for "
                    f"{len(self.labels)} labels: name each label once, in the labels' order"
                )
        for template in self.templates():
            template_fields(template)
        return self

    @property
    def split_names(self) -> dict[str, str]:
        """Which of the dataset's splits trains, validates and tests: by default its train and
        test splits, or train alone when test_fraction carves the test rows out of it."""
        if self.split is not None:
            return dict(self.split)
        return {"train": "train"} if self.test_fraction is not None else SPLIT_DEFAULT

    def templates(self) -> list[str]:
        given = [
            self.template,
            self.prompt_template,
            self.completion_template,
            *(self.labels or ()),
        ]
        return [t for t in given if t is not None]

    @property
    def task_name(self) -> str:
        return self.name or pathlib.Path(self.data).stem or self.data

    def as_template(self) -> Template:
        if self.objective == "lm":
            assert self.prompt_template is not None and self.completion_template is not None
            return Template(self.prompt_template, completion=self.completion_template)
        assert self.template is not None and self.labels is not None
        return Template(self.template, self.labels, self.label_field, self.label_names)


Split = tuple[str, list[Example]]  # where (for notes and errors), the examples


def _load(spec: TaskSpec) -> tuple[Any, str]:
    """The dataset's splits as `datasets` reads them, and what to call the source."""
    import datasets

    path = pathlib.Path(spec.data)
    try:
        if path.is_file():
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise DataError(
                    f"{path}: unknown file type {path.suffix!r}; allowed: "
                    f"{', '.join(_BUILDERS)} (or a folder of such files, or a hub dataset id)"
                )
            return datasets.load_dataset(builder, data_files={"train": str(path)}), str(path)
        if path.is_dir():
            return datasets.load_dataset(str(path)), str(path)
        if path.suffix.lower() in _BUILDERS or spec.data.startswith((".", "/")):
            raise DataError(f"task data {path} not found (read relative to {pathlib.Path.cwd()})")
        return datasets.load_dataset(spec.data), f"hub:{spec.data}"
    except DataError:
        raise
    except Exception as err:  # datasets raises many unrelated types for unreadable data
        raise DataError(
            f"task data {spec.data}: datasets could not read it ({type(err).__name__}: {err}); "
            "a local jsonl/json/csv/parquet file or folder, or a hub dataset id, is allowed"
        ) from None


def _examples(template: Template, rows: Iterable[Any], where: str) -> list[Example]:
    examples = []
    for index, row in enumerate(rows, start=1):
        try:
            examples.append(template.example(row))
        except RowError as err:
            raise DataError(f"{where}, row {index}: {err}") from None
    if not examples:
        raise DataError(f"{where} holds no rows")
    return examples


def _hold_out(
    examples: list[Example], fraction: float, seed: int, where: str
) -> tuple[list[Example], Split]:
    """The rows left, and a seed-independent ``fraction`` of them held out (at least one)."""
    order = np.random.default_rng(seed).permutation(len(examples))
    held = set(order[: max(1, math.ceil(fraction * len(examples)))].tolist())
    kept = [example for i, example in enumerate(examples) if i not in held]
    if not kept:
        raise DataError(f"{where} has {len(examples)} rows: too few to hold {fraction:g} out")
    return kept, (f"{where}, {fraction:g} held out", [examples[i] for i in sorted(held)])


def load_user_splits(spec: TaskSpec) -> tuple[Split, Split, Split, str, Objective]:
    """Train, validation and test examples, the source and the objective. Without a split for
    them, test_fraction and validation_fraction hold out seed-independent shares of the training
    rows (the test rows first), so every seed is scored on the same rows and a small file still
    leaves rows to validate on however many ``n_train`` asks for."""
    splits, source = _load(spec)
    available = ", ".join(splits)
    names = spec.split_names
    missing = [f"{key}: {name}" for key, name in names.items() if name not in splits]
    if missing:
        raise DataError(
            f"task data {spec.data} has no split {', '.join(missing)}; it has: {available}"
            + ("; a single file has one split, so hold out test rows with test_fraction")
            * (set(splits) == {"train"})
        )
    template = spec.as_template()

    def split(key: str) -> Split:
        where = f"{source} ({names[key]} split)"
        return where, _examples(template, splits[names[key]], where)

    train_from, train = split("train")
    if spec.test_fraction is None:
        test = split("test")
    else:
        train, test = _hold_out(train, spec.test_fraction, TEST_CARVE_SEED, train_from)
    if "validation" in names:
        val = split("validation")
    else:
        train, val = _hold_out(train, spec.validation_fraction, TEST_CARVE_SEED + 1, train_from)
    return (train_from, train), val, test, source, spec.objective
