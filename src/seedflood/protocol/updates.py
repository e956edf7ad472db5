"""The one update formula every SeedFlood client applies, simulated or real.

A message (step, origin, scalar g) becomes the update x ← x − (η/n)·g·u(seed), with u the
direction its seed draws and g exactly as the codec carries it. The simulator's clients and real
peers both turn messages into updates here, so their models agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

from seedflood.protocol.messages import Message
from seedflood.zo import Update, message_seed


def message_updates(
    messages: Sequence[Message], *, run_seed: int, lr: float, clients: int, weight: float = 1.0
) -> list[Update]:
    """Each message's update; ``weight`` scales it (a view's share of holders, or −1 to take
    it back)."""
    return [
        (
            message_seed(run_seed, m.origin, m.step),
            m.step,
            -lr / clients * m.scalar * weight,
        )
        for m in messages
    ]
