"""What every method shares: the interface the run loop drives, and client minibatches."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn

from seedflood.learning.scoring import TokenizedExample
from seedflood.zo import derive_seed


class Algorithm(Protocol):
    """A decentralized method over n simulated clients that share one working ``model``.

    Views put a client's (or the clients' average) parameters into ``model`` for the duration of
    a ``with`` block, so evaluation code never needs to know how a method stores its clients.
    """

    n: int
    model: nn.Module

    def run_round(self, round_index: int) -> dict[str, float]: ...

    def client_view(self, client: int) -> AbstractContextManager[None]: ...

    def global_view(self) -> AbstractContextManager[None]: ...

    def clients_identical(self) -> bool: ...

    def consensus_distance(self) -> float: ...

    def traffic(self) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]: ...

    def stop_reason(self) -> str | None: ...


def sample_batch(
    shard: Sequence[TokenizedExample], client: int, step: int, batch_size: int, run_seed: int
) -> list[TokenizedExample]:
    """Client ``client``'s minibatch at ``step``: a function of (run_seed, client, step) only, so
    every method and every implementation of one method sees the same data."""
    generator = torch.Generator().manual_seed(derive_seed(run_seed, "batch", client, step))
    picks = torch.randperm(len(shard), generator=generator, device="cpu")[:batch_size]
    return [shard[i] for i in picks.tolist()]
