"""Views of the parameters: the slices a direction changes, entered and left exactly.

Every change to the parameters goes through :class:`Touch`, which adds ``coef * values`` to views of
the parameters. Computing ``coef * values`` first and adding it second (never a fused
multiply-add) keeps per-message, batched and replayed application bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from seedflood.zo.seeds import Update


@dataclass
class Touch:
    """The parameter views a direction touches and the direction's values there."""

    views: list[torch.Tensor]
    values: list[torch.Tensor]

    def add_(self, coef: float) -> None:
        for view, value in zip(self.views, self.values, strict=True):
            view.add_(value * coef)

    def snapshot(self) -> list[torch.Tensor]:
        return [view.clone() for view in self.views]

    def restore(self, saved: Sequence[torch.Tensor]) -> None:
        for view, value in zip(self.views, saved, strict=True):
            view.copy_(value)


def two_point_estimate(loss: Callable[[], float], touch: Touch, eps: float) -> tuple[float, float]:
    """(f(x+εu) − f(x−εu)) / 2ε and the mean of the two losses.

    The parameters are saved and copied back rather than shifted by −2εu and +εu, so they come back
    bit-identical.
    """
    saved = touch.snapshot()
    touch.add_(eps)
    loss_plus = loss()
    touch.restore(saved)
    touch.add_(-eps)
    loss_minus = loss()
    touch.restore(saved)
    return (loss_plus - loss_minus) / (2.0 * eps), (loss_plus + loss_minus) / 2.0


@dataclass
class Region:
    """Slices of the parameters that a set of updates touches: whole tensors or rows of matrices.

    Saving and restoring a region is how a client's view is entered and left exactly.
    """

    tensors: list[torch.Tensor]
    rows: list[torch.Tensor | None]

    def save(self) -> list[torch.Tensor]:
        return [
            t.clone() if r is None else t[r] for t, r in zip(self.tensors, self.rows, strict=True)
        ]

    def restore(self, saved: Sequence[torch.Tensor]) -> None:
        for tensor, rows, values in zip(self.tensors, self.rows, saved, strict=True):
            if rows is None:
                tensor.copy_(values)
            else:
                tensor.index_copy_(0, rows, values)

    def values(self) -> torch.Tensor:
        """The region's current values, flattened in a fixed order."""
        parts = [t if r is None else t[r] for t, r in zip(self.tensors, self.rows, strict=True)]
        return torch.cat([p.flatten() for p in parts]) if parts else torch.zeros(0)


class Direction(Protocol):
    """What entering a view needs of a direction: the slices updates touch, and applying them."""

    def region(self, updates: Sequence[Update]) -> Region: ...

    def apply(self, updates: Sequence[Update]) -> None: ...


@contextmanager
def applied(direction: Direction, updates: Sequence[Update]) -> Iterator[None]:
    """The model with ``updates`` applied for the duration of the ``with`` block, then exactly as
    before: how a client's view is entered and left without a copy of the model."""
    if not updates:
        yield
        return
    region = direction.region(updates)
    saved = region.save()
    direction.apply(updates)
    try:
        yield
    finally:
        region.restore(saved)


CHUNK = 4096
"""Updates applied together at most: with a thousand clients a view can hold hundreds of
thousands of messages, whose coordinates all at once would take gigabytes."""


def chunks(updates: Sequence[Update]) -> Iterator[Sequence[Update]]:
    for start in range(0, len(updates), CHUNK):
        yield updates[start : start + CHUNK]
