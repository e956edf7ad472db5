"""Accuracy remembered by content, so the untrained model is scored once per test set.

Every run of a comparison grid scores its starting model on the test set before training, and
most runs of a grid start from the same parameters and share a seed's test set. On long-prompt
tasks that one evaluation costs minutes on a CPU (BoolQ's 500 test prompts took five
one-thread minutes), so later runs read the score back. The key is the parameters' bytes and the
tokenized examples, never a model or task name: a changed model, prompt or test set cannot hit a
stale entry, and a hit returns exactly the number an evaluation would have produced.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from seedflood.files import atomic_write_json
from seedflood.learning.models import cache_dir, state_hash
from seedflood.learning.precision import forward_dtype
from seedflood.learning.scoring import TokenizedExample, accuracy


def accuracy_key(
    model: nn.Module, examples: Sequence[TokenizedExample], pad_id: int, batch_size: int
) -> str:
    """What the score depends on: the parameters, the examples, the batching (it sets the
    padding, hence the last bits of every logit), the torch build that does the arithmetic, the
    device it runs on and the forwards' precision (each named only where it is not the CPU or
    fp32, so the entries of fp32 runs on the CPU keep their keys)."""
    params = list(model.parameters())
    digest = hashlib.sha256(state_hash(params).encode())
    digest.update(repr(list(examples)).encode())
    digest.update(f"pad={pad_id} batch={batch_size} torch={torch.__version__}".encode())
    if params[0].device.type != "cpu":
        digest.update(f"device={params[0].device.type}".encode())
    if forward_dtype() != "fp32":
        digest.update(f"dtype={forward_dtype()}".encode())
    return digest.hexdigest()


def cached_accuracy(
    model: nn.Module, examples: Sequence[TokenizedExample], pad_id: int, batch_size: int
) -> float:
    """``accuracy(model, examples, ...)``, read from the user cache when these exact parameters
    were scored on these exact examples before; an unreadable entry is scored again."""
    entry = cache_dir() / "accuracy" / f"{accuracy_key(model, examples, pad_id, batch_size)}.json"
    remembered = _read(entry)
    if remembered is not None:
        return remembered
    score = accuracy(model, examples, pad_id, batch_size)
    atomic_write_json(entry, {"accuracy": score, "examples": len(examples)})
    return score


def _read(entry: Path) -> float | None:
    try:
        return float(json.loads(entry.read_text())["accuracy"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
