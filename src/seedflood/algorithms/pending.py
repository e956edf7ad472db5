"""The coordinates of pending messages, drawn once per step and kept as arrays, so that batched
forwards can walk the shared weights by a thousand messages per client.

With hops below the diameter clients hold different pending messages, and batched forwards walk
the shared weights from one group of clients to the next by the messages that differ
(`SeedFlood._estimates_batched`). On a ring of 1,024 clients with hops = 1 neighbours differ by
about 1,024 messages and every group is one client, so one round walks about a million
(client, message) pairs: each of the 524,288 messages in flight twice. Built message by message,
each of those updates cost a blake2b seed and, since a cache of the last 16,384 seeds cannot hold
a round's working set, a fresh PCG64 draw of its coordinates: more than applying it. Here the
coordinates of every origin's message of a step are drawn once, when the step's first message is
made, and kept in one table (6 bytes per message and matrix where the shapes allow: 660 MB for
the messages in flight at 1,024 clients on SmolLM2-135M) until the step commits; a walk reads
which messages differ from two bit matrices and gathers their coordinates and scalars in a few
array operations, whatever the number of messages.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping

import numpy as np
import torch

from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.messages import Message
from seedflood.protocol.updates import coefficient
from seedflood.zo import SubCGEDirection, Terms, message_seed

Held = dict[int, int]
"""The pending messages a client holds: step → bitmask of origins (see FloodState.held)."""

Pending = Mapping[int, Mapping[int, Message]]


def split(source: Held, target: Held) -> tuple[Held, Held]:
    """The messages only ``source`` holds, and those only ``target`` holds."""
    steps = source.keys() | target.keys()
    dropped = {t: source.get(t, 0) & ~target.get(t, 0) for t in steps}
    gained = {t: target.get(t, 0) & ~source.get(t, 0) for t in steps}
    return dropped, gained


class PendingCoordinates:
    """Row, column and sign per matrix of every origin's message of each step not yet committed:
    one slot (3 × matrices × clients) of a table per step, reused once the step commits.

    ``steps`` is how many steps are expected in flight at once (about diameter / hops): the
    table starts that large and doubles only beyond it, since doubling copies it and holds two
    copies for a moment (at 1,024 clients, 660 MB each)."""

    def __init__(self, direction: SubCGEDirection, run_seed: int, clients: int, steps: int) -> None:
        self.direction = direction
        self.run_seed = run_seed
        self.clients = clients
        widest = max(max(len(w) for w in direction.matrices), direction.rank)
        dtype = np.int16 if widest <= np.iinfo(np.int16).max else np.int32
        # np.empty takes the pages of a slot only when the slot is written.
        self.table = np.empty((steps, 3, len(direction.matrices), clients), dtype)
        self.slots: dict[int, int] = {}
        self.free = list(range(steps - 1, -1, -1))

    def add(self, step: int) -> None:
        """Draw the coordinates of ``step``'s messages, once."""
        if step in self.slots:
            return
        if not self.free:
            grown = np.empty((max(4, 2 * len(self.table)), *self.table.shape[1:]), self.table.dtype)
            grown[: len(self.table)] = self.table
            self.free = list(range(len(grown) - 1, len(self.table) - 1, -1))
            self.table = grown
        slot = self.free.pop()
        seeds = [message_seed(self.run_seed, origin, step) for origin in range(self.clients)]
        coordinates = [self.direction.coordinates(seed) for seed in seeds]
        for part, values in enumerate(zip(*coordinates, strict=True)):
            self.table[slot, part] = torch.stack(values, dim=1).cpu().numpy()
        self.slots[step] = slot

    def retain(self, steps: Collection[int]) -> None:
        """Free the slots of the steps not in ``steps`` (committed, or cleared by the guard)."""
        for step in [s for s in self.slots if s not in steps]:
            self.free.append(self.slots.pop(step))

    def rows(self, steps: Collection[int]) -> Iterator[torch.Tensor]:
        """Per step of ``steps`` (the pending ones), the rows its messages touch (matrices ×
        clients): all that a walk among them may change, to be saved before it."""
        for step in steps:
            self.add(step)
            yield _indices(self.table[self.slots[step], 0], self.direction)

    def walker(
        self, pending: Pending, clip: ScalarClip | None, lr: Callable[[int], float]
    ) -> Walker:
        """Walks among the clients' models as ``pending`` stands now."""
        steps = sorted(pending)
        for step in steps:
            self.add(step)
        scalars = np.full((len(steps), self.clients), np.nan)
        for row, step in enumerate(steps):
            messages = list(pending[step].values())
            if clip is not None:  # as views apply them, clipped provisionally
                messages = clip.clip_pending(messages, pending)
            scalars[row, [m.origin for m in messages]] = [m.scalar for m in messages]
        return Walker(self, steps, scalars, lr)


class Walker:
    """The updates between two clients' models, from the pending coordinates and the pending
    messages' scalars (``scalars``: steps × origins)."""

    def __init__(
        self,
        coordinates: PendingCoordinates,
        steps: list[int],
        scalars: np.ndarray,
        lr: Callable[[int], float],
    ) -> None:
        self.coordinates = coordinates
        self.steps = steps
        self.slots = np.array([coordinates.slots[step] for step in steps], dtype=np.int64)
        self.scalars = scalars
        self.rates = np.array([lr(step) for step in steps], dtype=np.float64)
        self.epochs = np.array([coordinates.direction.epoch(step) for step in steps])

    def walk(self, source: Held, target: Held) -> Terms:
        """The updates turning the model of ``source`` into that of ``target``: the messages
        only ``source`` holds taken back, then those only ``target`` holds added, each by step
        and origin. The updates and order of `SeedFlood._difference`, so the walk rounds as
        applying that list does."""
        held, wanted = self._bits(source), self._bits(target)
        dropped, gained = np.nonzero(held & ~wanted), np.nonzero(wanted & ~held)
        rows = np.concatenate([dropped[0], gained[0]])
        origins = np.concatenate([dropped[1], gained[1]])
        weights = np.repeat([-1.0, 1.0], [len(dropped[0]), len(gained[0])])
        picked = self.coordinates.table[self.slots[rows], :, :, origins]  # K × 3 × matrices
        direction = self.coordinates.direction
        rows_cols_signs = _indices(np.ascontiguousarray(picked.transpose(1, 2, 0)), direction)
        device = rows_cols_signs.device
        coefs = coefficient(
            self.scalars[rows, origins],
            self.rates[rows],
            clients=self.coordinates.clients,
            weight=weights,
        )
        return Terms(
            rows=rows_cols_signs[0],
            cols=rows_cols_signs[1],
            signs=rows_cols_signs[2],
            coefs=torch.from_numpy(coefs).to(device),
            epochs=torch.from_numpy(self.epochs[rows]),
        )

    def _bits(self, held: Held) -> np.ndarray:
        """``held`` as a steps × origins boolean matrix."""
        width = (self.coordinates.clients + 7) // 8
        packed = b"".join(held.get(step, 0).to_bytes(width, "little") for step in self.steps)
        bits = np.unpackbits(
            np.frombuffer(packed, dtype=np.uint8).reshape(len(self.steps), width),
            axis=1,
            count=self.coordinates.clients,
            bitorder="little",
        )
        return bits.astype(bool)


def _indices(values: np.ndarray, direction: SubCGEDirection) -> torch.Tensor:
    """Stored coordinates as the index tensors the direction's matrices take."""
    return torch.from_numpy(values).to(direction.matrices[0].device, torch.long)
