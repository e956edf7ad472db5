"""The one update formula every SeedFlood client applies, simulated or real.

A message (step t, origin, scalar g) becomes the update x ← x − (η_t/n)·g·u(seed), with u the
direction its seed draws, g exactly as the codec carries it and η_t the rate of step t (a pure
function of t: see `seedflood.learning.schedules`). The simulator's clients and real
peers both turn messages into updates here, so their models agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from seedflood.protocol.messages import Message
from seedflood.zo import Update, message_seed

Values = TypeVar("Values", float, np.ndarray)


def coefficient(
    scalar: Values, rate: Values, *, clients: int, weight: Values | float = 1.0
) -> Values:
    """The coefficient −(η_t/n)·g·weight of u for a scalar g of a step whose rate is η_t, or
    elementwise for arrays of them: the same operations in the same order either way, so the
    same bits."""
    return -rate / clients * scalar * weight


def message_updates(
    messages: Sequence[Message],
    *,
    run_seed: int,
    lr: Callable[[int], float],
    clients: int,
    weight: float = 1.0,
) -> list[Update]:
    """Each message's update; ``weight`` scales it (a view's share of holders, or −1 to take
    it back)."""
    return [
        (
            message_seed(run_seed, m.origin, m.step),
            m.step,
            coefficient(m.scalar, lr(m.step), clients=clients, weight=weight),
        )
        for m in messages
    ]
