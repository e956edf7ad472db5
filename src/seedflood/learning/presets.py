"""The built-in tasks: MeZO's templates (princeton-nlp/MeZO, ``large_models/templates.py``) as
presets of the template mechanism, so that accuracies stay comparable with the published
zeroth-order fine-tuning numbers.

A preset adds what a YAML template cannot say: where its files lie, its hub name, and ``derive``,
a Python step from a file's row to the template's fields (MultiRC's passages flattened into one
row per answer, COPA's clause-cased choices, WSC's nested spans).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from seedflood.learning.examples import RowError
from seedflood.learning.templates import Row, Template, field, text


def _as_is(row: Row) -> Iterable[Row]:
    return (row,)


def _stripped_sentence(row: Row) -> Iterable[Row]:
    return ({**row, "sentence": text(row, "sentence").strip()},)


def _wsc_spans(row: Row) -> Iterable[Row]:
    # The jsonl files nest the spans under "target"; the hub's rows carry them at top level.
    spans = field(row, "target", dict) if "target" in row else row
    pronoun, noun = text(spans, "span2_text").lower(), text(spans, "span1_text")
    return ({**row, "span2_text": pronoun, "span1_text": noun},)


_COPA_CONJUNCTIONS = {"cause": " because", "effect": " so"}


def _copa_choice(choice: str) -> str:
    """MeZO lower-cases the first word (except "I") so the choice reads as a clause continuation."""
    first, sep, rest = choice.partition(" ")
    return " " + (first if first == "I" else first.lower()) + sep + rest


def _copa_clauses(row: Row) -> Iterable[Row]:
    premise = text(row, "premise").rstrip().removesuffix(".")
    question = text(row, "question")
    if question not in _COPA_CONJUNCTIONS:
        raise RowError(f"column 'question' has value {question!r}; allowed: 'cause', 'effect'")
    choices = {name: _copa_choice(text(row, name)) for name in ("choice1", "choice2")}
    return ({**row, **choices, "premise": premise + _COPA_CONJUNCTIONS[question]},)


def _multirc_answers(row: Row) -> Iterator[Row]:
    """Flatten a passage into one row per answer, with the hub's column names, so that the
    jsonl files and the hub go through the same template."""
    passage = field(row, "passage", dict)
    paragraph = text(passage, "text")
    for question in field(passage, "questions", list):
        for answer in field(question, "answers", list):
            yield {
                "paragraph": paragraph,
                "question": text(question, "question"),
                "answer": text(answer, "text"),
                "label": field(answer, "label", object),
            }


@dataclass(frozen=True)
class Preset:
    template: Template
    folder: str
    files: tuple[str, str | None, str]  # train pool, validation pool (None: carve from train), test
    hub: tuple[str, str]
    derive: Callable[[Row], Iterable[Row]] = _as_is  # a hub row → the template's rows
    file_rows: Callable[[Row], Iterable[Row]] = _as_is  # one jsonl line → the hub's rows


_NO_YES = ("No", "Yes")
_GLUE = ("train", None, "validation")
_FEWGLUE = ("train", "dev32", "val")
# RTE and BoolQ have full-size training files: validation is carved from what training leaves, as
# the hub path does, rather than FewGLUE's 32 rows, which give a ±17-point reading.
_FULL_TRAIN = ("train", None, "val")
_NLI = '{premise}\nDoes this mean that "{hypothesis}" is true? Yes or No?\n'
_CB = 'Suppose {premise} Can we infer that "{hypothesis}"? Yes, No, or Maybe?\n'
_WIC = (
    'Does the word "{word}" have the same meaning in these two sentences? Yes, No?\n'
    "{sentence1}\n{sentence2}\n"
)
_WSC = (
    '{text}\nIn the previous sentence, does the pronoun "{span2_text}" refer to {span1_text}? '
    "Yes or No?\n"
)
_MULTIRC = (
    '{paragraph}\nQuestion: {question}\nI found this answer "{answer}". Is that correct? '
    "Yes or No?\n"
)

PRESETS: dict[str, Preset] = {
    "sst2": Preset(
        Template("{sentence} It was", (" terrible", " great")),
        "sst2",
        _GLUE,
        ("glue", "sst2"),
        derive=_stripped_sentence,
    ),
    "boolq": Preset(
        Template("{passage} {question}?\n", _NO_YES),
        "superglue/BoolQ",
        _FULL_TRAIN,
        ("super_glue", "boolq"),
    ),
    "rte": Preset(
        Template(_NLI, ("Yes", "No"), label_names=("entailment", "not_entailment")),
        "superglue/RTE",
        _FULL_TRAIN,
        ("super_glue", "rte"),
    ),
    "wic": Preset(Template(_WIC, _NO_YES), "superglue/WiC", _FEWGLUE, ("super_glue", "wic")),
    "cb": Preset(
        Template(
            _CB, ("Yes", "No", "Maybe"), label_names=("entailment", "contradiction", "neutral")
        ),
        "superglue/CB",
        _FEWGLUE,
        ("super_glue", "cb"),
    ),
    "copa": Preset(
        Template("{premise}", ("{choice1}", "{choice2}")),
        "superglue/COPA",
        _FEWGLUE,
        ("super_glue", "copa"),
        derive=_copa_clauses,
    ),
    "wsc": Preset(
        Template(_WSC, _NO_YES),
        "superglue/WSC",
        _FEWGLUE,
        ("super_glue", "wsc.fixed"),
        derive=_wsc_spans,
    ),
    "multirc": Preset(
        Template(_MULTIRC, _NO_YES),
        "superglue/MultiRC",
        _FEWGLUE,
        ("super_glue", "multirc"),
        file_rows=_multirc_answers,
    ),
}
TASKS: tuple[str, ...] = tuple(PRESETS)
