"""Classification tasks as prompt-plus-candidates, in the MeZO style.

Each example is scored by comparing the model's likelihood of each candidate continuation after
the prompt, so a task is nothing more than a row-to-(prompt, candidates, label) converter. The
templates are MeZO's (princeton-nlp/MeZO, ``large_models/templates.py``) so that accuracies stay
comparable with the published zero-order fine-tuning numbers.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

PARTITION_SCHEMES: tuple[str, ...] = ("uniform", "dirichlet")

_T = TypeVar("_T")
_Row = Mapping[str, Any]
_LAYOUT = (
    "expected layout: <dir>/sst2/{train,validation}.jsonl and "
    "<dir>/superglue/<Task>/{train,dev32,val}.jsonl for BoolQ, CB, COPA, MultiRC, RTE, WSC, WiC"
)
_NO_SOURCE = (
    "set SEEDFLOOD_DATA_DIR to a directory with the standard GLUE/SuperGLUE jsonl files "
    f"({_LAYOUT}), or install `datasets` and have network access"
)


class DataError(ValueError):
    """Task data is missing or malformed; the message says where and what is allowed."""


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str  # text up to the answer; a candidate's leading space stays with the candidate
    candidates: tuple[str, ...]  # one continuation per class (COPA: per example)
    label: int  # index into candidates


@dataclass(frozen=True)
class TaskData:
    task: str
    train: list[Example]
    val: list[Example]
    test: list[Example]
    notes: list[str]  # deviations from the requested protocol, e.g. too few rows
    source: str  # "data_dir:<path>" or "hub:<dataset>"


class _RowError(Exception):
    """A problem inside one row; the reader adds the file and line it came from."""


def _field(row: object, column: str, kind: type[_T]) -> _T:
    if not isinstance(row, Mapping):
        raise _RowError(f"expected a JSON object, got {row!r:.60}")
    if column not in row:
        raise _RowError(f"missing column {column!r}")
    value = row[column]
    if not isinstance(value, kind):
        raise _RowError(f"column {column!r} must be a {kind.__name__}, got {value!r:.60}")
    return value


def _text(row: object, column: str) -> str:
    return _field(row, column, str)


def _label(row: _Row, n_classes: int, names: tuple[str, ...] = ()) -> int:
    """Accept the class index, the class name, or (binary tasks) a JSON boolean, since the
    GLUE/SuperGLUE files and the hub spell labels in all three ways."""
    value = _field(row, "label", object)
    if isinstance(value, str) and value in names:
        return names.index(value)
    binary_ok = n_classes == 2 or not isinstance(value, bool)
    if isinstance(value, int) and binary_ok and 0 <= value < n_classes:
        return int(value)
    allowed = [str(i) for i in range(n_classes)]
    allowed += ["false", "true"] if n_classes == 2 else []
    allowed += [repr(name) for name in names]
    raise _RowError(f"column 'label' has value {value!r}; allowed: {', '.join(allowed)}")


_NO_YES = ("No", "Yes")


def _sst2(row: _Row) -> Example:
    return Example(
        f"{_text(row, 'sentence').strip()} It was", (" terrible", " great"), _label(row, 2)
    )


def _boolq(row: _Row) -> Example:
    prompt = f"{_text(row, 'passage')} {_text(row, 'question')}?\n"
    return Example(prompt, _NO_YES, _label(row, 2))


def _rte(row: _Row) -> Example:
    prompt = (
        f'{_text(row, "premise")}\nDoes this mean that "{_text(row, "hypothesis")}" is true? '
        "Yes or No?\n"
    )
    return Example(prompt, ("Yes", "No"), _label(row, 2, ("entailment", "not_entailment")))


def _cb(row: _Row) -> Example:
    prompt = (
        f'Suppose {_text(row, "premise")} Can we infer that "{_text(row, "hypothesis")}"? '
        "Yes, No, or Maybe?\n"
    )
    names = ("entailment", "contradiction", "neutral")
    return Example(prompt, ("Yes", "No", "Maybe"), _label(row, 3, names))


def _wic(row: _Row) -> Example:
    prompt = (
        f'Does the word "{_text(row, "word")}" have the same meaning in these two sentences? '
        f"Yes, No?\n{_text(row, 'sentence1')}\n{_text(row, 'sentence2')}\n"
    )
    return Example(prompt, _NO_YES, _label(row, 2))


def _wsc(row: _Row) -> Example:
    # The jsonl files nest the spans under "target"; the hub's rows carry them at top level.
    spans = _field(row, "target", dict) if "target" in row else row
    prompt = (
        f"{_text(row, 'text')}\nIn the previous sentence, does the pronoun "
        f'"{_text(spans, "span2_text").lower()}" refer to {_text(spans, "span1_text")}? '
        "Yes or No?\n"
    )
    return Example(prompt, _NO_YES, _label(row, 2))


def _multirc(row: _Row) -> Example:
    prompt = (
        f"{_text(row, 'paragraph')}\nQuestion: {_text(row, 'question')}\n"
        f'I found this answer "{_text(row, "answer")}". Is that correct? Yes or No?\n'
    )
    return Example(prompt, _NO_YES, _label(row, 2))


_COPA_CONJUNCTIONS = {"cause": " because", "effect": " so"}


def _copa_choice(choice: str) -> str:
    """MeZO lower-cases the first word (except "I") so the choice reads as a clause continuation."""
    first, sep, rest = choice.partition(" ")
    return " " + (first if first == "I" else first.lower()) + sep + rest


def _copa(row: _Row) -> Example:
    premise = _text(row, "premise").rstrip().removesuffix(".")
    question = _text(row, "question")
    if question not in _COPA_CONJUNCTIONS:
        raise _RowError(f"column 'question' has value {question!r}; allowed: 'cause', 'effect'")
    choices = (_copa_choice(_text(row, "choice1")), _copa_choice(_text(row, "choice2")))
    return Example(premise + _COPA_CONJUNCTIONS[question], choices, _label(row, 2))


def _multirc_answers(row: _Row) -> Iterator[_Row]:
    """Flatten a passage into one row per answer, with the hub's column names, so that the
    jsonl files and the hub go through the same converter."""
    passage = _field(row, "passage", dict)
    paragraph = _text(passage, "text")
    for question in _field(passage, "questions", list):
        for answer in _field(question, "answers", list):
            yield {
                "paragraph": paragraph,
                "question": _text(question, "question"),
                "answer": _text(answer, "text"),
                "label": _field(answer, "label", object),
            }


def _as_is(row: _Row) -> Iterable[_Row]:
    return (row,)


@dataclass(frozen=True)
class _Spec:
    convert: Callable[[_Row], Example]
    folder: str
    files: tuple[str, str | None, str]  # train pool, validation pool (None: carve from train), test
    hub: tuple[str, str]
    hub_rows: Callable[[_Row], Iterable[_Row]] = _as_is  # one jsonl line as the hub's rows


_GLUE = ("train", None, "validation")
_FEWGLUE = ("train", "dev32", "val")
_SPECS: dict[str, _Spec] = {
    "sst2": _Spec(_sst2, "sst2", _GLUE, ("glue", "sst2")),
    "boolq": _Spec(_boolq, "superglue/BoolQ", _FEWGLUE, ("super_glue", "boolq")),
    "rte": _Spec(_rte, "superglue/RTE", _FEWGLUE, ("super_glue", "rte")),
    "wic": _Spec(_wic, "superglue/WiC", _FEWGLUE, ("super_glue", "wic")),
    "cb": _Spec(_cb, "superglue/CB", _FEWGLUE, ("super_glue", "cb")),
    "copa": _Spec(_copa, "superglue/COPA", _FEWGLUE, ("super_glue", "copa")),
    "wsc": _Spec(_wsc, "superglue/WSC", _FEWGLUE, ("super_glue", "wsc.fixed")),
    "multirc": _Spec(
        _multirc, "superglue/MultiRC", _FEWGLUE, ("super_glue", "multirc"), _multirc_answers
    ),
}
TASKS: tuple[str, ...] = tuple(_SPECS)

_Pool = tuple[str, list[Example]]  # where the examples came from (for notes), the examples


def _convert(
    spec: _Spec,
    rows: Iterable[tuple[str, Any]],
    where: str,
    as_hub_rows: Callable[[_Row], Iterable[_Row]] = _as_is,
) -> _Pool:
    examples: list[Example] = []
    for place, row in rows:
        try:
            examples.extend(spec.convert(flat) for flat in as_hub_rows(row))
        except _RowError as err:
            raise DataError(f"{place}: {err}") from None
    if not examples:
        raise DataError(f"{where} contains no examples: it needs one JSON object per line")
    return where, examples


def _jsonl_rows(path: pathlib.Path) -> Iterator[tuple[str, Any]]:
    """Rows with their place, refusing what ``json`` would turn into an unrelated error: bytes that
    are not UTF-8, nesting deep enough to exhaust the stack, integers too long to convert."""
    if not path.is_file():
        raise DataError(f"{path} not found; {_LAYOUT}")
    try:
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                where = f"{path}, line {number}"
                try:
                    text = raw.decode("utf-8-sig")
                except UnicodeDecodeError as err:
                    raise DataError(f"{where}: not UTF-8 text ({err})") from None
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except (ValueError, RecursionError) as err:
                    raise DataError(f"{where}: not valid JSON ({err})") from None
                yield where, row
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from None


def _dir_pools(spec: _Spec, root: pathlib.Path) -> tuple[_Pool, _Pool | None, _Pool]:
    if not root.is_dir():
        problem = "is a file, not a directory" if root.exists() else "does not exist"
        raise DataError(f"data directory {root} {problem}; {_LAYOUT}")

    def pool(name: str) -> _Pool:
        path = root / spec.folder / f"{name}.jsonl"
        return _convert(spec, _jsonl_rows(path), str(path), spec.hub_rows)

    train, val, test = spec.files
    return pool(train), None if val is None else pool(val), pool(test)


def _hub_pools(spec: _Spec) -> tuple[_Pool, None, _Pool]:
    """Train and validation come from the hub's train split, as in MeZO; its test split has no
    labels, so the validation split is the held-out test set."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"`datasets` is not installed; {_NO_SOURCE}") from None
    name = "/".join(spec.hub)
    try:
        splits = datasets.load_dataset(*spec.hub)
    except Exception as err:  # network, hub and cache failures have no common type
        raise DataError(f"could not load {name} from the hub ({err}); {_NO_SOURCE}") from err

    def pool(split: str) -> _Pool:
        rows = ((f"hub:{name} {split} row {i}", row) for i, row in enumerate(splits[split]))
        return _convert(spec, rows, f"hub:{name} {split}")

    return pool("train"), None, pool("validation")


def _take(
    pool: list[Example], sizes: Sequence[int], rng: np.random.Generator
) -> list[list[Example]]:
    """Disjoint random draws of the given sizes (fewer once the pool runs out), each put back in
    source order so that a run's examples can be read side by side with the files."""
    order = rng.permutation(len(pool))
    draws, start = [], 0
    for size in sizes:
        chosen = np.sort(order[start : start + size])
        start += len(chosen)
        draws.append([pool[i] for i in chosen])
    return draws


def data_dir_from_env() -> pathlib.Path | None:
    value = os.environ.get("SEEDFLOOD_DATA_DIR", "")
    return pathlib.Path(value) if value else None


def load_task(
    task: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    n_train: int = 1024,
    n_val: int = 500,
    n_test: int = 1000,
) -> TaskData:
    """Sample disjoint train/val sets and a held-out test set; every shortfall becomes a note,
    because the few-shot data directories hold far fewer rows than the paper's protocol asks."""
    if task not in _SPECS:
        raise DataError(f"unknown task {task!r}; allowed: {', '.join(TASKS)}")
    for name, size in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if size < 1:
            raise DataError(f"{name} must be >= 1, got {size}")
    spec = _SPECS[task]
    root = pathlib.Path(data_dir) if data_dir is not None else data_dir_from_env()
    pools = _hub_pools(spec) if root is None else _dir_pools(spec, root)
    (train_from, train_pool), val_source, (test_from, test_pool) = pools

    rng = np.random.default_rng(seed)
    if val_source is None:
        train, val = _take(train_pool, (n_train, n_val), rng)
        val_from = f"{train_from} after taking {len(train)} for training"
    else:
        val_from, val_pool = val_source
        (train,) = _take(train_pool, (n_train,), rng)
        (val,) = _take(val_pool, (n_val,), rng)
    (test,) = _take(test_pool, (n_test,), rng)

    notes = [
        f"{task}: only {len(got)} {split} examples available from {where}; "
        f"using {len(got)} instead of {wanted}"
        for split, got, wanted, where in (
            ("training", train, n_train, train_from),
            ("validation", val, n_val, val_from),
            ("test", test, n_test, test_from),
        )
        if len(got) < wanted
    ]
    source = f"hub:{'/'.join(spec.hub)}" if root is None else f"data_dir:{root}"
    return TaskData(task, train, val, test, notes, source)


def _dirichlet_shards(
    examples: Sequence[Example], n_clients: int, alpha: float, rng: np.random.Generator
) -> list[list[int]]:
    labels = np.array([example.label for example in examples])
    shards: list[list[int]] = [[] for _ in range(n_clients)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cuts = (np.cumsum(rng.dirichlet([alpha] * n_clients))[:-1] * len(members)).astype(int)
        for shard, part in zip(shards, np.split(members, cuts), strict=True):
            shard.extend(part.tolist())
    # A client with no data cannot take a step; the largest shard always has one to spare
    # because there are at least as many examples as clients.
    for empty in (shard for shard in shards if not shard):
        empty.append(max(shards, key=len).pop())
    return [rng.permutation(shard).tolist() for shard in shards]


def partition(
    examples: Sequence[Example],
    n_clients: int,
    *,
    seed: int = 0,
    scheme: str = "uniform",
    alpha: float = 0.5,
) -> list[list[Example]]:
    """Split training data across clients; "dirichlet" skews each client's label mix (smaller
    alpha, more skew) to model the non-IID data of a real decentralized deployment."""
    if scheme not in PARTITION_SCHEMES:
        raise DataError(
            f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_SCHEMES)}"
        )
    if n_clients < 1:
        raise DataError(f"n_clients must be >= 1, got {n_clients}")
    if n_clients > len(examples):
        raise DataError(
            f"{n_clients} clients but only {len(examples)} training examples: every client needs "
            "one; use fewer clients or more training data"
        )
    rng = np.random.default_rng(seed)
    if scheme == "uniform":
        shards = [
            part.tolist() for part in np.array_split(rng.permutation(len(examples)), n_clients)
        ]
    else:
        if not alpha > 0:
            raise DataError(f"alpha must be > 0, got {alpha}")
        shards = _dirichlet_shards(examples, n_clients, alpha, rng)
    return [[examples[i] for i in shard] for shard in shards]
