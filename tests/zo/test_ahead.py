"""Directions drawn ahead on worker threads are the directions drawn alone, in the order given."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from seedflood.zo import DenseDirection, DrawsAhead, message_seed

SIZES = [15, 7]


@pytest.fixture
def direction() -> DenseDirection:
    return DenseDirection([nn.Parameter(torch.zeros(3, 5)), nn.Parameter(torch.zeros(7))])


def alone(direction: DenseDirection, seed: int) -> torch.Tensor:
    outs = [torch.empty(size) for size in SIZES]
    direction.draw_into(seed, outs)
    return torch.cat(outs)


SEEDS = [message_seed(0, client, 0) for client in range(6)]


def buffers(workers: int) -> list[torch.Tensor]:
    return [torch.full((sum(SIZES),), float("nan")) for _ in range(workers + 1)]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_draws_ahead_are_the_draws_made_alone(direction: DenseDirection, workers: int) -> None:
    with DrawsAhead(direction, SIZES, SEEDS, buffers(workers)) as ahead:
        taken = [ahead.take(seed).clone() for seed in SEEDS]
        with pytest.raises(ValueError, match="after every seed given was taken"):
            ahead.take(SEEDS[0])
    for seed, values in zip(SEEDS, taken, strict=True):
        assert torch.equal(values, alone(direction, seed))
    assert len({tuple(values.tolist()) for values in taken}) == len(SEEDS)


def test_a_taken_buffer_keeps_its_draw_until_the_next_take(direction: DenseDirection) -> None:
    """The workers go on drawing the next seeds into the other buffers meanwhile."""
    with DrawsAhead(direction, SIZES, SEEDS, buffers(2)) as ahead:
        for seed in SEEDS:
            values = ahead.take(seed)
            time.sleep(0.01)
            assert torch.equal(values, alone(direction, seed))


def test_draws_are_taken_in_the_order_given(direction: DenseDirection) -> None:
    ahead = DrawsAhead(direction, SIZES, SEEDS, buffers(2))
    with ahead, pytest.raises(ValueError, match=f"seed {SEEDS[0]} is next"):
        ahead.take(SEEDS[1])
    with pytest.raises(ValueError, match="one worker needs two buffers; got 1"):
        DrawsAhead(direction, SIZES, SEEDS, buffers(0))
