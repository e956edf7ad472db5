"""SeedFlood: zeroth-order steps whose (seed, scalar) messages are flooded to every client.

The simulator keeps one model, the *base*: the initial weights plus every message that every
client already holds, applied in canonical (step, origin) order. A client's own model is the base
plus the messages it holds beyond that prefix, applied in the same order; it is materialised only
while that client computes and restored exactly afterwards. Because application is a fixed
sequence of floating-point adds, base + rest equals what a client with its own copy computes,
bit for bit, and with hops = diameter every message reaches everyone in its round, nothing is
pending and all clients *are* the base.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from seedflood.algorithms.common import sample_batch
from seedflood.batched import Segment, segment_losses
from seedflood.flooding import FloodState
from seedflood.messages import Message, quantize
from seedflood.network import SimulatedNetwork, flood
from seedflood.scoring import TokenizedExample, loss_and_correct
from seedflood.topology import Topology
from seedflood.zo import (
    DenseDirection,
    SubCGEDirection,
    message_seed,
    two_point_estimate,
)

Update = tuple[int, int, float]


class Ledger:
    """The messages one client holds beyond the committed prefix, by step and then origin."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[int, Message]] = {}

    def add(self, message: Message) -> None:
        self.by_step.setdefault(message.step, {})[message.origin] = message

    def count(self, step: int) -> int:
        return len(self.by_step.get(step, ()))

    def pop(self, step: int) -> list[Message]:
        held = self.by_step.pop(step, {})
        return [held[origin] for origin in sorted(held)]

    def ordered(self) -> list[Message]:
        return [
            self.by_step[step][origin]
            for step in sorted(self.by_step)
            for origin in sorted(self.by_step[step])
        ]

    def __len__(self) -> int:
        return sum(len(held) for held in self.by_step.values())


class SeedFlood:
    """n SeedFlood clients over one shared base model."""

    def __init__(
        self,
        *,
        model: nn.Module,
        direction: DenseDirection | SubCGEDirection,
        topology: Topology,
        shards: Sequence[Sequence[TokenizedExample]],
        pad_id: int,
        lr: float,
        eps: float,
        batch_size: int,
        local_steps: int,
        hops: int,
        scalar_format: str,
        run_seed: int,
        batched: bool = False,
    ) -> None:
        if len(shards) != topology.n:
            raise ValueError(f"{len(shards)} data shards for {topology.n} clients")
        self.model = model
        self.direction = direction
        self.topology = topology
        self.shards = shards
        self.pad_id = pad_id
        self.lr, self.eps = lr, eps
        self.batch_size = batch_size
        self.local_steps = local_steps
        self.hops = hops
        self.scalar_format = scalar_format
        self.run_seed = run_seed
        if batched and not isinstance(direction, SubCGEDirection):
            raise ValueError(
                "batched forwards need subcge directions; dense ones differ everywhere"
            )
        self.batched = batched
        self.n = topology.n
        self.network = SimulatedNetwork(topology.neighbors, scalar_format)
        self.floods = [FloodState(i, topology.neighbors[i]) for i in range(self.n)]
        self.ledgers = [Ledger() for _ in range(self.n)]
        self.committed_step = -1
        self.messages_made = 0

    def updates(self, messages: Sequence[Message], weight: float = 1.0) -> list[Update]:
        """Every client applies x ← x − (η/n)·g·u(seed) with g exactly as the codec carries it."""
        return [
            (
                message_seed(self.run_seed, m.origin, m.step),
                m.step,
                -self.lr / self.n * m.scalar * weight,
            )
            for m in messages
        ]

    def batch(self, client: int, step: int) -> list[TokenizedExample]:
        return sample_batch(self.shards[client], client, step, self.batch_size, self.run_seed)

    @contextmanager
    def _applied(self, updates: list[Update]) -> Iterator[None]:
        if not updates:
            yield
            return
        region = self.direction.region(updates)
        saved = region.save()
        self.direction.apply(updates)
        try:
            yield
        finally:
            region.restore(saved)

    def client_view(self, client: int) -> Any:
        """The model as ``client`` holds it, for the duration of the ``with`` block."""
        return self._applied(self.updates(self.ledgers[client].ordered()))

    def global_view(self) -> Any:
        """The average of all clients' models (the paper's GMP): each pending message weighted by
        the share of clients that hold it."""
        holders: dict[tuple[int, int], tuple[Message, int]] = {}
        for ledger in self.ledgers:
            for message in ledger.ordered():
                _, count = holders.get(message.key, (message, 0))
                holders[message.key] = (message, count + 1)
        updates = [
            self.updates([message], count / self.n)[0]
            for key, (message, count) in sorted(holders.items())
        ]
        return self._applied(updates)

    def clients_identical(self) -> bool:
        return all(len(ledger) == 0 for ledger in self.ledgers)

    def consensus_distance(self) -> float:
        """(1/n) Σ_i ‖x_i − x̄‖² over the parameters, computed on the region pending messages touch
        (everything else is the base, identical for all)."""
        if self.clients_identical():
            return 0.0
        pending = sorted({m.key: m for ledger in self.ledgers for m in ledger.ordered()}.values())
        region = self.direction.region(self.updates(pending))
        views = []
        for client in range(self.n):
            with self.client_view(client):
                views.append(region.values().double())
        mean = torch.stack(views).mean(dim=0)
        return float(sum(((v - mean) ** 2).sum() for v in views) / self.n)

    def _estimates_one_by_one(self, step: int) -> list[tuple[float, float]]:
        estimates = []
        for client in range(self.n):
            batch = self.batch(client, step)
            with self.client_view(client):
                touch = self.direction.touch(message_seed(self.run_seed, client, step), step)
                estimates.append(
                    two_point_estimate(
                        lambda b=batch: loss_and_correct(self.model, b, self.pad_id)[0],
                        touch,
                        self.eps,
                    )
                )
        return estimates

    def _estimates_batched(self, step: int) -> list[tuple[float, float]]:
        """Every client's f(x_c ± εu_c) in shared forwards: the ± perturbation is one more update
        (seed, step, ±ε) on top of the client's pending messages."""
        segments = []
        for client in range(self.n):
            pending = self.updates(self.ledgers[client].ordered())
            seed = message_seed(self.run_seed, client, step)
            batch = self.batch(client, step)
            for sign in (1.0, -1.0):
                segments.append(Segment(batch, [*pending, (seed, step, sign * self.eps)]))
        losses = segment_losses(self.model, self.direction, segments, self.pad_id)
        return [
            ((plus - minus) / (2.0 * self.eps), (plus + minus) / 2.0)
            for plus, minus in zip(losses[0::2], losses[1::2], strict=True)
        ]

    def run_round(self, round_index: int) -> dict[str, float]:
        """``local_steps`` ZO steps on every client, then ``hops`` flooding hops, then commit."""
        losses, scalars = [], []
        for offset in range(self.local_steps):
            step = round_index * self.local_steps + offset
            if self.batched:
                estimates = self._estimates_batched(step)
            else:
                estimates = self._estimates_one_by_one(step)
            for client, (scalar, loss) in enumerate(estimates):
                message = Message(step, client, quantize(scalar, self.scalar_format))
                self.floods[client].originate(message)
                self.ledgers[client].add(message)
                losses.append(loss)
                scalars.append(abs(message.scalar))
                self.messages_made += 1
        for client, received in enumerate(flood(self.floods, self.network, self.hops)):
            for message in received:
                self.ledgers[client].add(message)
        self._commit()
        return {
            "train_loss": sum(losses) / len(losses),
            "mean_abs_scalar": sum(scalars) / len(scalars),
            "pending_messages": float(sum(len(ledger) for ledger in self.ledgers)),
        }

    def _commit(self) -> None:
        """Fold every step that all clients hold completely into the base, in canonical order."""
        while all(ledger.count(self.committed_step + 1) == self.n for ledger in self.ledgers):
            step = self.committed_step + 1
            every_clients_copy = [ledger.pop(step) for ledger in self.ledgers]
            self.direction.apply(self.updates(every_clients_copy[0]))
            self.committed_step = step

    def traffic(self) -> dict[str, float]:
        return self.network.summary()

    def describe(self) -> dict[str, Any]:
        return {
            "hops": self.hops,
            "messages_total": self.messages_made,
            "committed_step": self.committed_step,
            "direction": self.direction.name,
        }
