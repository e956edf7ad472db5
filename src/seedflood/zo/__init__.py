"""Zeroth-order directions, seeds and the two-point estimate.

A SeedFlood update is fully described by (origin, step, scalar): the direction u is regenerated
from a seed derived from (run_seed, origin, step), so every client can rebuild any client's update.
One module per idea: ``seeds`` derives them, ``views`` holds the parameter slices a direction
changes (and the exact two-point estimate over them), ``dense`` is MeZO's Gaussian direction over
every parameter (O(d) a message; ``ahead`` draws a known sequence of them on worker threads)
and ``subcge`` the subspace canonical-basis one (one row per weight matrix, O(Σ n_in) a message).
Callers import from here; ``make_direction`` picks by name.
"""

from __future__ import annotations

from torch import nn

from seedflood.zo.ahead import DrawsAhead
from seedflood.zo.dense import DenseDirection
from seedflood.zo.seeds import Update, derive_seed, message_generator, message_seed
from seedflood.zo.subcge import (
    DirectionError,
    SubCGEDirection,
    Terms,
    add_rows_in_order,
    trainable_matrices,
)
from seedflood.zo.views import Region, Touch, applied, two_point_estimate

__all__ = [
    "DIRECTIONS",
    "DenseDirection",
    "DirectionError",
    "DrawsAhead",
    "Region",
    "SubCGEDirection",
    "Terms",
    "Touch",
    "Update",
    "add_rows_in_order",
    "applied",
    "derive_seed",
    "make_direction",
    "message_generator",
    "message_seed",
    "trainable_matrices",
    "two_point_estimate",
]

DIRECTIONS: tuple[str, ...] = ("subcge", "dense")


def make_direction(
    kind: str, model: nn.Module, *, rank: int, refresh: int, run_seed: int
) -> DenseDirection | SubCGEDirection:
    if kind == "dense":
        return DenseDirection([p for p in model.parameters()])
    if kind == "subcge":
        matrices = trainable_matrices(model)
        names = {id(p): name for name, p in model.named_parameters()}
        return SubCGEDirection(
            matrices,
            rank=rank,
            refresh=refresh,
            run_seed=run_seed,
            names=[names[id(w)] for w in matrices],
        )
    raise ValueError(f"direction must be one of {DIRECTIONS}; got {kind!r}")
