"""Rows to examples through Python format strings over a row's fields.

One mechanism serves the built-in tasks and a user's own data: a prompt template, one template per
candidate (a fixed label word like " great", or a field such as COPA's "{choice1}"), and the field
holding the label; or, for language modelling, a prompt and a completion template. Template fields
must be text so that a number or a missing value never slips silently into a prompt.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from seedflood.learning.examples import Example, RowError

_T = TypeVar("_T")
Row = Mapping[str, Any]


def as_row(row: object) -> Row:
    if not isinstance(row, Mapping):
        raise RowError(f"expected a JSON object, got {row!r:.60}")
    return row


def field(row: object, column: str, kind: type[_T]) -> _T:
    row = as_row(row)
    if column not in row:
        raise RowError(f"missing column {column!r}")
    value = row[column]
    if not isinstance(value, kind):
        raise RowError(f"column {column!r} must be a {kind.__name__}, got {value!r:.60}")
    return value


def text(row: object, column: str) -> str:
    return field(row, column, str)


def label_index(row: Row, column: str, n_classes: int, names: tuple[str, ...] = ()) -> int:
    """Accept the class index, the class name, or (binary tasks) a JSON boolean, since the
    GLUE/SuperGLUE files and the hub spell labels in all three ways."""
    value = field(row, column, object)
    if isinstance(value, str) and value in names:
        return names.index(value)
    binary_ok = n_classes == 2 or not isinstance(value, bool)
    if isinstance(value, int) and binary_ok and 0 <= value < n_classes:
        return int(value)
    allowed = [str(i) for i in range(n_classes)]
    allowed += ["false", "true"] if n_classes == 2 else []
    allowed += [repr(name) for name in names]
    raise RowError(f"column {column!r} has value {value!r}; allowed: {', '.join(allowed)}")


def template_fields(template: str) -> tuple[str, ...]:
    """The row fields a template reads, in order; a ValueError names what is not allowed (an
    unbalanced brace, a positional ``{}``, an attribute or index such as ``{a.b}``)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"template {template!r}: {error}") from None
    names = tuple(name for _, name, _, _ in parsed if name is not None)
    for name in names:
        if not name.isidentifier():
            raise ValueError(
                f"template {template!r}: field {{{name}}} must name a column, such as {{text}}"
            )
    return names


def fill(template: str, row: Row) -> str:
    return template.format_map({name: text(row, name) for name in template_fields(template)})


@dataclass(frozen=True)
class Template:
    """How a row becomes an example: ``completion`` set means language modelling (one candidate,
    label 0); otherwise ``candidates`` are the classes and ``label_field`` says which is right."""

    prompt: str
    candidates: tuple[str, ...] = ()
    label_field: str = "label"
    label_names: tuple[str, ...] = ()
    completion: str | None = None

    def example(self, row: Row) -> Example:
        row = as_row(row)
        prompt = fill(self.prompt, row)
        if self.completion is not None:
            return Example(prompt, (fill(self.completion, row),), 0)
        candidates = tuple(fill(candidate, row) for candidate in self.candidates)
        label = label_index(row, self.label_field, len(candidates), self.label_names)
        return Example(prompt, candidates, label)
