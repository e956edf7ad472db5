"""One real SeedFlood client: its own model, its data shard, a transport and a message log.

A peer runs the simulator's rounds for a single client: one zeroth-order step, flooding over its
transport for ``hops`` lockstep hops (the diameter, so every message of the round arrives in the
round), then commits every complete step in canonical order and appends it to its log. With
staleness 0 every peer steps on the same committed model, so all peers, and the simulator with
one-client-at-a-time estimates, hold bit-identical parameters: `state_hash` shows it.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from seedflood.algorithms.common import sample_batch
from seedflood.algorithms.seedflood import message_updates
from seedflood.flooding import FloodState
from seedflood.messages import Message, quantize
from seedflood.metrics import atomic_write_bytes
from seedflood.msglog import MessageLog
from seedflood.network import Transport, flood
from seedflood.scoring import TokenizedExample, loss_and_correct
from seedflood.zo import SubCGEDirection, message_seed, two_point_estimate


def state_hash(matrices: Sequence[torch.Tensor]) -> str:
    """SHA-256 over the trained parameters' bytes, in order: equal hashes, equal models."""
    digest = hashlib.sha256()
    for tensor in matrices:
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_snapshot(path: Path, matrices: Sequence[torch.Tensor], logged: int) -> None:
    """The trained matrices after the first ``logged`` log messages, written atomically."""
    buffer = io.BytesIO()
    torch.save({"logged": logged, "matrices": [m.clone() for m in matrices]}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


class Peer:
    """The client ``me`` of an n-client run, hosted alone in this process."""

    def __init__(
        self,
        *,
        me: int,
        clients: int,
        neighbors: Sequence[int],
        model: nn.Module,
        direction: SubCGEDirection,
        shard: Sequence[TokenizedExample],
        pad_id: int,
        transport: Transport,
        log: MessageLog,
        lr: float,
        eps: float,
        batch_size: int,
        hops: int,
        scalar_format: str,
        run_seed: int,
        snapshot_every: int = 0,
    ) -> None:
        self.me, self.clients = me, clients
        self.model, self.direction = model, direction
        self.shard, self.pad_id = shard, pad_id
        self.transport, self.log = transport, log
        self.lr, self.eps, self.batch_size = lr, eps, batch_size
        self.hops, self.scalar_format, self.run_seed = hops, scalar_format, run_seed
        self.flood_state = FloodState(me, neighbors)
        self.pending: dict[int, dict[int, Message]] = {}
        self.committed_step = -1
        self.snapshot_every = snapshot_every
        self.snapshot_path = log.path.with_name("snapshot.pt")
        self.replayed = self._restore()

    def _apply(self, messages: Sequence[Message]) -> None:
        self.direction.apply(
            message_updates(messages, run_seed=self.run_seed, lr=self.lr, clients=self.clients)
        )

    def _restore(self) -> int:
        """Rebuild the committed model: the latest snapshot, then the log after it (the log alone
        is the model; snapshots bound the replay). Returns how many messages were replayed."""
        start = 0
        if self.snapshot_path.is_file():
            snapshot = torch.load(self.snapshot_path)
            for matrix, saved in zip(self.direction.matrices, snapshot["matrices"], strict=True):
                matrix.copy_(saved)
            start = snapshot["logged"]
        tail = self.log.messages(start)
        self._apply(tail)
        if self.log.last is not None:
            self.committed_step = self.log.last.step
            self.flood_state.forget_before(self.committed_step + 1)
        return len(tail)

    def run_round(self, round_index: int) -> float:
        """One step, ``hops`` lockstep flooding hops, commit; returns the step's mean loss."""
        step = round_index
        if step <= self.committed_step:
            raise ValueError(f"step {step} is already committed (up to {self.committed_step})")
        batch = sample_batch(self.shard, self.me, step, self.batch_size, self.run_seed)
        touch = self.direction.touch(message_seed(self.run_seed, self.me, step), step)
        scalar, loss = two_point_estimate(
            lambda: loss_and_correct(self.model, batch, self.pad_id)[0], touch, self.eps
        )
        message = Message(step, self.me, quantize(scalar, self.scalar_format))
        self.flood_state.originate(message)
        self.pending.setdefault(step, {})[self.me] = message
        for received in flood([self.flood_state], self.transport, self.hops)[0]:
            self.pending.setdefault(received.step, {})[received.origin] = received
        self._commit()
        return loss

    def _commit(self) -> None:
        before = self.committed_step
        while len(self.pending.get(self.committed_step + 1, {})) == self.clients:
            step = self.committed_step + 1
            held = self.pending.pop(step)
            messages = [held[origin] for origin in sorted(held)]
            self._apply(messages)
            self.log.append(messages)
            self.committed_step = step
            self.flood_state.forget_before(step + 1)
        self.log.sync()
        every = self.snapshot_every
        if every and (self.committed_step + 1) // every > (before + 1) // every:
            save_snapshot(self.snapshot_path, self.direction.matrices, len(self.log))

    def state_hash(self) -> str:
        return state_hash(self.direction.matrices)
