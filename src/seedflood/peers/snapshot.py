"""A peer's snapshot: its trained matrices after the first ``logged`` messages of its log.

The log alone is the model; a snapshot only bounds the replay after a restart, so one that
cannot be trusted is set aside with a warning and the model rebuilt from the log. A snapshot is
not trusted when it is damaged or cut short (it is sealed: `seedflood.learning.sealed`), holds other
matrices than this peer's direction, or covers more messages than the log read back: a damaged
last log record is dropped as a torn tail, and the step it held, already inside the snapshot,
would otherwise be applied a second time once a neighbour sends it again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from seedflood.learning.sealed import SealedFileError, load_sealed, save_sealed

log = logging.getLogger(__name__)


def save_snapshot(path: Path, matrices: Sequence[torch.Tensor], logged: int) -> None:
    """The trained matrices after the first ``logged`` log messages, written atomically."""
    save_sealed(path, {"logged": logged, "matrices": [m.detach().clone() for m in matrices]})


def _usable(
    path: Path, matrices: Sequence[torch.Tensor], logged: int
) -> tuple[int, list[torch.Tensor]]:
    """How many messages the snapshot covers and its matrices, if it can stand in for them in a
    log of ``logged`` messages; raises SealedFileError naming what is wrong otherwise."""
    snapshot = load_sealed(path)
    covered, saved = snapshot.get("logged"), snapshot.get("matrices")
    if type(covered) is not int or not 0 <= covered <= logged:
        raise SealedFileError(
            f"{path} covers {covered!r} messages, but the log holds {logged}: the snapshot is "
            "ahead of the log (its last records were lost)"
        )
    shapes = [(m.shape, m.dtype) for m in matrices]
    tensors = isinstance(saved, list) and all(isinstance(m, torch.Tensor) for m in saved)
    if not tensors or [(m.shape, m.dtype) for m in saved] != shapes:
        raise SealedFileError(f"{path} holds other matrices than this peer's direction")
    return covered, saved


def restore_snapshot(path: Path, matrices: Sequence[torch.Tensor], logged: int) -> int:
    """Copy the snapshot at ``path`` into ``matrices`` and return how many log messages it
    covers; 0, with ``matrices`` untouched, when there is none or it is not trusted."""
    if not path.is_file():
        return 0
    try:
        covered, saved = _usable(path, matrices, logged)
    except (SealedFileError, OSError) as error:
        log.warning("ignoring the snapshot: %s; rebuilding the model from the log alone", error)
        return 0
    with torch.no_grad():
        for matrix, value in zip(matrices, saved, strict=True):
            matrix.copy_(value)
    return covered
