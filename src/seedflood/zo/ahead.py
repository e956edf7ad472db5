"""Dense directions drawn ahead of their use, on worker threads.

Full-parameter DZSGD spends most of a round drawing one 135M-value Gaussian per client and step
on a single thread (docs/performance.md, "Resuming a DZSGD run from its scalars"). A round's
seeds are known before it starts, numpy fills an array without holding the GIL, and each seed
has a generator of its own, so the draws can run side by side and beside the forwards that use
them. Each buffer holds exactly what ``DenseDirection.draw_into`` gives for its seed alone: a run
ends bit for bit where it ends without workers, whatever their number.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import torch

from seedflood.zo.dense import DenseDirection


class DrawsAhead:
    """The directions of ``seeds``, in that order, each drawn into one of ``buffers`` (flat CPU
    tensors of the direction's size) by one of len(buffers) − 1 threads before ``take`` asks for
    it. A buffer ``take`` returns stays valid until the next ``take``.

    The caller keeps the buffers from one round to the next: fresh ones would be paged in on
    every round, by threads that then wait on each other for the process's page tables."""

    def __init__(
        self,
        direction: DenseDirection,
        sizes: Sequence[int],
        seeds: Sequence[int],
        buffers: Sequence[torch.Tensor],
    ) -> None:
        if len(buffers) < 2:
            raise ValueError(f"one worker needs two buffers; got {len(buffers)}")
        self._direction = direction
        self._sizes = list(sizes)
        self._waiting = deque(seeds)
        self._pool = ThreadPoolExecutor(len(buffers) - 1, thread_name_prefix="draw")
        self._free = list(buffers)
        self._drawing: deque[tuple[int, torch.Tensor, Future[None]]] = deque()
        self._lent: torch.Tensor | None = None
        self._submit()

    def _submit(self) -> None:
        while self._free and self._waiting:
            seed, buffer = self._waiting.popleft(), self._free.pop()
            parts = buffer.split(self._sizes)
            future = self._pool.submit(self._direction.draw_into, seed, parts)
            self._drawing.append((seed, buffer, future))

    def take(self, seed: int) -> torch.Tensor:
        """u for ``seed``, which must be the next of the seeds given."""
        if self._lent is not None:
            self._free.append(self._lent)
            self._lent = None
        self._submit()
        if not self._drawing:
            raise ValueError(f"seed {seed} asked for after every seed given was taken")
        expected, buffer, future = self._drawing.popleft()
        if seed != expected:
            raise ValueError(f"draws are taken in the order given: seed {expected} is next")
        future.result()
        self._lent = buffer
        return buffer

    def close(self) -> None:
        """Stop the workers; draws not yet begun are dropped."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> DrawsAhead:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
