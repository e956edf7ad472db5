"""Robust scalar clipping: one client's huge scalar must not move everyone's model.

A flooded scalar is a lever on every model in the network: a client that sends g × 1,000 moves
all of them a thousand steps at once. Each committed scalar of step t is therefore clipped to
±c · median |g| over the messages of steps t − W .. t (c = ``clip_multiple``, W = ``clip_window``
steps; the step itself is included so there is a bound from step 0 on). An honest ZO scalar is a
directional derivative whose size varies little between clients and steps, so c = 3 leaves honest
messages alone while a poisoner's lever shrinks to c times a typical step.

Consensus survives because the bound depends only on committed history: every client commits step
t only once it holds every message of every step up to t, in canonical order, so every client
computes the same median from the same raw scalars and applies the same clipped value. The median
is taken over the raw scalars, so an attacker cannot raise the bound by more than its one message
per step can move a median of n.

Messages not yet committed (hops < diameter, staleness > 0) enter a client's view clipped by the
bound of the committed window plus the pending messages of their step that this process knows of
(in the simulator: every client's). Views are provisional in any case; committed states are exact.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from seedflood.protocol.messages import Message


class ScalarClip:
    """The clipping window of one client (the simulator's base counts as one client)."""

    def __init__(self, multiple: float, window: int) -> None:
        if not multiple > 0:
            raise ValueError(f"clip_multiple must be > 0, got {multiple}")
        if window < 1:
            raise ValueError(f"clip_window must be >= 1 step, got {window}")
        self.multiple = multiple
        self.window = window
        self.recent: deque[list[float]] = deque(maxlen=window)
        self.clipped = 0

    @classmethod
    def from_config(cls, config: Any) -> ScalarClip | None:
        """None when ``clip_multiple`` is unset: no clipping, bit-identical to before."""
        if config.clip_multiple is None:
            return None
        return cls(config.clip_multiple, config.clip_window)

    def bound(self, step_messages: Sequence[Message]) -> float:
        """c × the median |scalar| over the window and ``step_messages`` (one step's messages)."""
        sizes = [abs(m.scalar) for m in step_messages]
        for earlier in self.recent:
            sizes += earlier
        return self.multiple * statistics.median(sizes) if sizes else 0.0

    def clip(self, step_messages: Sequence[Message]) -> list[Message]:
        """The messages of one step as they are applied: scalars limited to ±bound."""
        limit = self.bound(step_messages)
        return [_limited(m, limit) for m in step_messages]

    def commit(self, step_messages: Sequence[Message]) -> list[Message]:
        """Clip one step for good, then let its raw scalars into the window of later steps."""
        clipped = self.clip(step_messages)
        self.clipped += sum(
            a.scalar != b.scalar for a, b in zip(clipped, step_messages, strict=True)
        )
        self.recent.append([abs(m.scalar) for m in step_messages])
        return clipped

    def clip_pending(
        self, messages: Iterable[Message], pending: Mapping[int, Mapping[int, Message]]
    ) -> list[Message]:
        """Uncommitted messages as a view applies them: each step's bound from the window and
        that step's messages in ``pending``, so a message is clipped the same way whichever
        other pending messages it is applied with."""
        limits: dict[int, float] = {}
        clipped = []
        for m in messages:
            if m.step not in limits:
                limits[m.step] = self.bound(list(pending.get(m.step, {}).values()) or [m])
            clipped.append(_limited(m, limits[m.step]))
        return clipped


def _limited(message: Message, limit: float) -> Message:
    if abs(message.scalar) <= limit:
        return message
    return dataclasses.replace(message, scalar=limit if message.scalar > 0 else -limit)
