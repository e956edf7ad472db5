"""SeedFlood: zeroth-order steps whose (seed, scalar) messages are flooded to every client.

The simulator keeps one model, the *base*: the initial weights plus every message that every
client already holds, applied in canonical (step, origin) order. A client's own model is the base
plus the messages it holds beyond that prefix, applied in the same order; it is materialised only
while that client computes and restored exactly afterwards. Because application is a fixed
sequence of floating-point adds, base + rest equals what a client with its own copy computes,
bit for bit, and with hops = diameter every message reaches everyone in its round, nothing is
pending and all clients *are* the base.

Memory grows with the messages in flight, not with n·d: what each client holds is read from its
flood state (a bitmask per step), and each message is stored once. Batched forwards trade the
last bit of exactness for speed when clients differ (hops < diameter): the shared weights walk
from client to client by the messages that differ, so views agree with exact ones to rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from seedflood.algorithms.batched import Segment, forward_tokens, segment_losses
from seedflood.algorithms.common import sample_batch
from seedflood.algorithms.graphs import forward_graphs
from seedflood.algorithms.pending import Held, PendingCoordinates, split
from seedflood.learning.models import state_hash
from seedflood.learning.schedules import Rate, as_rate
from seedflood.learning.scoring import TokenizedExample, loss_and_correct
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.flooding import FloodState, Transport, flood, origins
from seedflood.protocol.guard import DivergenceGuard, Tripped, guard_record
from seedflood.protocol.messages import LARGEST, Message, saturate
from seedflood.protocol.updates import Update, message_updates
from seedflood.topology import Topology
from seedflood.zo import (
    DenseDirection,
    SubCGEDirection,
    applied,
    message_seed,
    two_point_estimate,
)


class Network(Transport, Protocol):
    """The transport the runner hands SeedFlood: it floods, is told each round (a simulated
    partition starts and ends on rounds), and reports its traffic and what it did."""

    def at_round(self, round_index: int) -> None: ...

    def summary(self) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]: ...


class Repair(Protocol):
    """Anti-entropy over ``network`` after a round's hops, when the runner's links can lose
    packets: how many exchanges it took (at most ``limit``), and its own traffic."""

    def repair(
        self,
        floods: Sequence[FloodState],
        pending: dict[int, dict[int, Message]],
        network: Network,
        round_index: int,
        limit: int,
    ) -> int: ...

    def summary(self) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]: ...


MAX_CORRECTIONS = 256
"""Batched forwards group consecutive clients while each differs from the group's first by at
most this many messages: a correction costs a few gathers per input row and trained matrix, and
a few hundred of them stay well below the cost of the row's forward."""


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
        lr: float | Rate,
        eps: float | Rate,
        batch_size: int,
        local_steps: int,
        hops: int,
        scalar_format: str,
        run_seed: int,
        network: Network,
        repair: Repair | None = None,
        batched: bool = False,
        repair_exchanges: int = 64,
        clip: ScalarClip | None = None,
        guard: DivergenceGuard | None = None,
    ) -> None:
        if len(shards) != topology.n:
            raise ValueError(f"{len(shards)} data shards for {topology.n} clients")
        self.model = model
        self.direction = direction
        self.topology = topology
        self.shards = shards
        self.pad_id = pad_id
        self.lr, self.eps = as_rate(lr), as_rate(eps)
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
        device = next(model.parameters()).device
        self.tokens_per_forward = forward_tokens(device)
        self.graphs = forward_graphs(device) if batched else None
        self.n = topology.n
        in_flight = local_steps * (topology.diameter // max(hops, 1) + 2)
        self.walks = (
            PendingCoordinates(direction, run_seed, self.n, in_flight)
            if isinstance(direction, SubCGEDirection)
            else None
        )
        if repair_exchanges < 0:
            raise ValueError(f"repair_exchanges must be >= 0, got {repair_exchanges}")
        self.repair_exchanges = repair_exchanges
        self.network = network
        self.repair = repair
        self.floods = [FloodState(i, topology.neighbors[i]) for i in range(self.n)]
        self.pending: dict[int, dict[int, Message]] = {}
        self.committed_step = -1
        self.messages_made = 0
        self.saturated = 0
        self.unlogged: list[Message] = []
        self.guard = guard
        self.tripped: Tripped | None = None
        self.refused: list[Message] = []  # the step the guard tripped on, never committed
        self.committed_count = 0
        self.clip = clip

    def updates(self, messages: Sequence[Message], weight: float = 1.0) -> list[Update]:
        """Updates of pending messages, as views apply them (clipped provisionally)."""
        if self.clip is not None:
            messages = self.clip.clip_pending(messages, self.pending)
        return message_updates(
            messages, run_seed=self.run_seed, lr=self.lr, clients=self.n, weight=weight
        )

    def batch(self, client: int, step: int) -> list[TokenizedExample]:
        return sample_batch(self.shards[client], client, step, self.batch_size, self.run_seed)

    def held(self, client: int) -> Held:
        """What ``client`` holds beyond the committed prefix; its flood state is the record."""
        state = self.floods[client]
        return {step: mask for step in self.pending if (mask := state.held(step))}

    def _messages(self, held: Held) -> list[Message]:
        """Held messages in canonical (step, origin) order."""
        return [
            self.pending[step][origin] for step in sorted(held) for origin in origins(held[step])
        ]

    def _all_pending(self) -> list[Message]:
        return [self.pending[t][o] for t in sorted(self.pending) for o in sorted(self.pending[t])]

    def held_messages(self, client: int) -> list[Message]:
        return self._messages(self.held(client))

    def _difference(self, source: Held, target: Held) -> list[Update]:
        """Updates turning the model of ``source`` into that of ``target``, up to rounding: the
        messages only ``source`` holds taken back, then those only ``target`` holds added."""
        dropped, gained = split(source, target)
        return self.updates(self._messages(dropped), -1.0) + self.updates(self._messages(gained))

    def client_view(self, client: int) -> Any:
        """The model as ``client`` holds it, exactly, for the duration of the ``with`` block."""
        return applied(self.direction, self.updates(self.held_messages(client)))

    def _holder_counts(self, step: int) -> np.ndarray:
        """How many clients hold each origin's message of ``step``."""
        width = (self.n + 7) // 8
        packed = b"".join(state.held(step).to_bytes(width, "little") for state in self.floods)
        bits = np.unpackbits(
            np.frombuffer(packed, dtype=np.uint8).reshape(self.n, width), axis=1, bitorder="little"
        )
        return bits[:, : self.n].sum(axis=0)

    def global_view(self) -> Any:
        """The average of all clients' models (the paper's GMP): each pending message weighted by
        the share of clients that hold it."""
        counts = {step: self._holder_counts(step) for step in self.pending}
        return applied(
            self.direction,
            [
                self.updates([m], int(counts[m.step][m.origin]) / self.n)[0]
                for m in self._all_pending()
            ],
        )

    def clients_identical(self) -> bool:
        return not self.pending

    def consensus_distance(self) -> float:
        """(1/n) Σ_i ‖x_i − x̄‖² over the parameters, on the region pending messages touch
        (everything else is the base, identical for all), one client at a time."""
        if self.clients_identical():
            return 0.0
        region = self.direction.region(self.updates(self._all_pending()))
        with self.global_view():
            mean = region.values()
        total = 0.0
        for client in range(self.n):
            with self.client_view(client):
                spread = region.values() - mean
                total += float((spread * spread).sum(dtype=torch.float64))
        return total / self.n

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
                        self.eps(step),
                    )
                )
        return estimates

    def _groups(self, helds: Sequence[Held]) -> list[list[int]]:
        """Runs of consecutive clients whose models differ from the run's first by at most
        MAX_CORRECTIONS messages (all clients at once when nothing is pending)."""
        groups: list[list[int]] = []
        for client, held in enumerate(helds):
            if groups:
                first = helds[groups[-1][0]]
                steps = first.keys() | held.keys()
                differing = sum((first.get(t, 0) ^ held.get(t, 0)).bit_count() for t in steps)
                if differing <= MAX_CORRECTIONS:
                    groups[-1].append(client)
                    continue
            groups.append([client])
        return groups

    def _estimates_batched(self, step: int) -> list[tuple[float, float]]:
        """Every client's f(x_c ± εu_c) in shared forwards. Clients go in groups of similar
        models: the shared weights walk from one group's first client to the next by applying
        only the messages that differ, each client's difference from them (and its ± perturbation,
        one more update (seed, step, ±ε)) is added in the forward, and the weights are restored
        exactly at the end. With hops below the diameter the first walk, from the base, is
        merged (`SubCGEDirection.apply_terms_merged`); with hops = diameter the few messages
        pending after a lost packet are applied in order, as the commit will apply them, so a
        lossy run ends on the loss-free run's hash."""
        assert self.walks is not None and isinstance(self.direction, SubCGEDirection)
        helds = [self.held(client) for client in range(self.n)]
        walker = self.walks.walker(self.pending, self.clip, self.lr)
        region = self.direction.rows_region(self.walks.rows(self.pending.keys()))
        saved = region.save()
        eps = self.eps(step)
        estimates: list[tuple[float, float]] = []
        shared: Held = {}
        try:
            for group in self._groups(helds):
                walk = walker.walk(shared, helds[group[0]])
                if shared or self.hops >= self.topology.diameter:
                    self.direction.apply_terms(walk)
                else:  # from the base: a quarter of a million updates at 1,024 clients, hops = 1
                    self.direction.apply_terms_merged(walk)
                shared = helds[group[0]]
                segments = []
                for client in group:
                    correction = self._difference(shared, helds[client])
                    seed = message_seed(self.run_seed, client, step)
                    batch = self.batch(client, step)
                    for sign in (1.0, -1.0):
                        segments.append(Segment(batch, [*correction, (seed, step, sign * eps)]))
                losses = segment_losses(
                    self.model,
                    self.direction,
                    segments,
                    self.pad_id,
                    self.tokens_per_forward,
                    self.graphs,
                )
                estimates += [
                    ((plus - minus) / (2.0 * eps), (plus + minus) / 2.0)
                    for plus, minus in zip(losses[0::2], losses[1::2], strict=True)
                ]
        finally:
            region.restore(saved)
        return estimates

    def estimates(self, step: int) -> list[tuple[float, float]]:
        """Every client's (scalar, mean loss) at ``step`` on the model it holds now, the weights
        restored exactly afterwards: what a round floods, and what benchmarks/precision.py
        recomputes under another forward precision on the same models."""
        if self.batched:
            return self._estimates_batched(step)
        return self._estimates_one_by_one(step)

    def run_round(self, round_index: int) -> dict[str, float]:
        """``local_steps`` ZO steps on every client, then ``hops`` flooding hops, then (over
        faulty links) anti-entropy exchanges, then commit."""
        losses, scalars = [], []
        for offset in range(self.local_steps):
            step = round_index * self.local_steps + offset
            for client, (scalar, loss) in enumerate(self.estimates(step)):
                message = self.make_message(step, client, scalar)
                self._originate(message)
                losses.append(loss)
                scalars.append(abs(message.scalar))
        return {
            "train_loss": sum(losses) / len(losses),
            "mean_abs_scalar": sum(scalars) / len(scalars),
            **self._spread(round_index),
        }

    def replay_round(self, round_index: int, messages: Sequence[Message]) -> None:
        """Round ``round_index`` with its messages given instead of estimated: flooded, repaired
        and committed as the run did, with no forward pass. A run resumed from its ledger
        replays its logged rounds this way, which restores the model, the flood states, the
        traffic counters and the clip and guard windows exactly."""
        for message in messages:
            self.saturated += abs(message.scalar) == LARGEST[self.scalar_format]
            self._originate(message)
        self._spread(round_index)

    def _originate(self, message: Message) -> None:
        self.floods[message.origin].originate(message)
        self.pending.setdefault(message.step, {})[message.origin] = message
        self.messages_made += 1
        if self.walks is not None:
            self.walks.add(message.step)

    def _spread(self, round_index: int) -> dict[str, float]:
        """The round's flooding hops, anti-entropy over faulty links, then commit."""
        self.network.at_round(round_index)
        flood(self.floods, self.network, self.hops)
        stats: dict[str, float] = {}
        if self.repair is not None:
            exchanges = self.repair.repair(
                self.floods, self.pending, self.network, round_index, self.repair_exchanges
            )
            stats["repair_exchanges"] = float(exchanges)
        self._commit()
        if self.walks is not None:
            self.walks.retain(self.pending.keys())
        return {"pending_messages": float(self.pending_held()), **stats}

    def make_message(self, step: int, client: int, scalar: float) -> Message:
        """The message ``client`` floods for its estimate (fault-injection subclasses lie here),
        clamped to what the wire format carries."""
        value, clamped = saturate(scalar, self.scalar_format)
        self.saturated += clamped
        return Message(step, client, value)

    def pending_held(self) -> int:
        """Messages held beyond the committed prefix, summed over clients."""
        return sum(state.held(step).bit_count() for state in self.floods for step in self.pending)

    def _commit(self) -> None:
        """Fold every step that all clients hold completely into the base, in canonical order."""
        everyone = (1 << self.n) - 1
        while (step := self.committed_step + 1) in self.pending and all(
            state.held(step) == everyone for state in self.floods
        ):
            held = self.pending[step]
            messages = [held[o] for o in sorted(held)]
            committed = messages if self.clip is None else self.clip.commit(messages)
            if self.guard is not None and (tripped := self.guard.check(step, committed)):
                self.tripped, self.refused = tripped, messages
                self.pending.clear()  # the run ends on the model of the step before
                return
            del self.pending[step]
            self.unlogged += messages
            self.committed_count += len(messages)
            self.direction.apply(
                message_updates(committed, run_seed=self.run_seed, lr=self.lr, clients=self.n)
            )
            self.committed_step = step
            for state in self.floods:
                state.forget_before(step + 1)

    def in_flight(self) -> list[Message]:
        """Messages made but not yet committed everywhere, in canonical (step, origin) order,
        the step the guard refused among them: with the committed ones, every message the run
        has made (a replay of them trips the guard where the run did)."""
        pending = (
            self.pending[step][o]
            for step in sorted(self.pending)
            for o in sorted(self.pending[step])
        )
        return [*self.refused, *pending]

    def take_committed(self) -> list[Message]:
        """The messages committed since the last call, as flooded (before clipping, which a
        replay redoes): what the runner appends to the run's ledger."""
        taken, self.unlogged = self.unlogged, []
        return taken

    def traffic(self) -> dict[str, float]:
        """Flood traffic, and anti-entropy's apart; repair costs nothing over perfect links."""
        repair = {"repair_bytes_per_edge_max": 0.0, "repair_bytes_per_edge_mean": 0.0}
        if self.repair is not None:
            repair = self.repair.summary()
        return {**self.network.summary(), **repair}

    def state_hash(self) -> str:
        """The committed state's hash (the base, without pending messages): equal on every
        client once nothing is pending, and comparable with real peers' hashes."""
        return state_hash(self.direction.tensors)

    def describe(self) -> dict[str, Any]:
        return {
            "hops": self.hops,
            "messages_total": self.messages_made,
            "saturated_scalars": self.saturated,
            "committed_step": self.committed_step,
            "direction": self.direction.name,
            "state_hash": self.state_hash(),
            **({"clipped_messages": self.clip.clipped} if self.clip is not None else {}),
            **(self.repair.describe() if self.repair is not None else {}),
            **self.network.describe(),
            "guard": guard_record(self.guard, self.tripped),
        }

    def stop_reason(self) -> str | None:
        """Why the run must stop now: the divergence guard refused a step."""
        if self.tripped is None:
            return None
        return self.tripped.explain(self.lr(self.tripped.step))
