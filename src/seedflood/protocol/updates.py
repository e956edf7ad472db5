"""The one update formula every SeedFlood client applies, simulated or real.

A message (step t, origin, scalar g) becomes the update x ← x − (η_t/n)·g·u(seed), with u the
direction its seed draws, g exactly as the codec carries it and η_t the rate of step t (a pure
function of t: see `seedflood.learning.schedules`). The simulator's clients and real
peers both turn messages into updates here, so their models agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from seedflood.protocol.messages import Message
from seedflood.zo import Update, message_seed


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
            -lr(m.step) / clients * m.scalar * weight,
        )
        for m in messages
    ]
