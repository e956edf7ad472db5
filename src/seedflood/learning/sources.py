"""Where the built-in tasks' rows come from: the standard GLUE/SuperGLUE jsonl files under a data
directory, or the Hugging Face hub. Every row keeps its place (file and line, or split and row) so
that an error names it."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any

from seedflood.learning.examples import DataError, Example, RowError
from seedflood.learning.presets import Preset
from seedflood.learning.templates import Row, as_row

LAYOUT = (
    "expected layout: <dir>/sst2/{train,validation}.jsonl and "
    "<dir>/superglue/<Task>/{train,dev32,val}.jsonl for BoolQ, CB, COPA, MultiRC, RTE, WSC, WiC"
)
_NO_SOURCE = (
    "set SEEDFLOOD_DATA_DIR to a directory with the standard GLUE/SuperGLUE jsonl files "
    f"({LAYOUT}), or install `datasets` and have network access"
)

Pool = tuple[str, list[Example]]  # where the examples came from (for notes), the examples


def convert(
    preset: Preset, rows: Iterable[tuple[str, Any]], where: str, *, from_file: bool
) -> Pool:
    """The examples of ``rows`` (each with its place), through the preset's steps."""
    examples: list[Example] = []
    for place, row in rows:
        try:
            hub_rows: Iterable[Row] = preset.file_rows(row) if from_file else (row,)
            for hub_row in hub_rows:
                derived = preset.derive(as_row(hub_row))
                examples.extend(preset.template.example(r) for r in derived)
        except RowError as err:
            raise DataError(f"{place}: {err}") from None
    if not examples:
        raise DataError(f"{where} contains no examples: it needs one JSON object per line")
    return where, examples


def jsonl_rows(path: pathlib.Path) -> Iterator[tuple[str, Any]]:
    """Rows with their place, refusing what ``json`` would turn into an unrelated error: bytes that
    are not UTF-8, nesting deep enough to exhaust the stack, integers too long to convert."""
    if not path.is_file():
        raise DataError(f"{path} not found; {LAYOUT}")
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


def dir_pools(preset: Preset, root: pathlib.Path) -> tuple[Pool, Pool | None, Pool]:
    if not root.is_dir():
        problem = "is a file, not a directory" if root.exists() else "does not exist"
        raise DataError(f"data directory {root} {problem}; {LAYOUT}")

    def pool(name: str) -> Pool:
        path = root / preset.folder / f"{name}.jsonl"
        return convert(preset, jsonl_rows(path), str(path), from_file=True)

    train, val, test = preset.files
    return pool(train), None if val is None else pool(val), pool(test)


def hub_pools(preset: Preset) -> tuple[Pool, None, Pool]:
    """Train and validation come from the hub's train split, as in MeZO; its test split has no
    labels, so the validation split is the held-out test set."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"`datasets` is not installed; {_NO_SOURCE}") from None
    name = "/".join(preset.hub)
    try:
        splits = datasets.load_dataset(*preset.hub)
    except Exception as err:  # network, hub and cache failures have no common type
        raise DataError(f"could not load {name} from the hub ({err}); {_NO_SOURCE}") from err

    def pool(split: str) -> Pool:
        rows = ((f"hub:{name} {split} row {i}", row) for i, row in enumerate(splits[split]))
        return convert(preset, rows, f"hub:{name} {split}", from_file=False)

    return pool("train"), None, pool("validation")
