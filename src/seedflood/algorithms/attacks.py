"""Poisoning clients, to measure what one dishonest scalar does and what clipping prevents.

Fault injection in the hivemind style: a subclass that misbehaves on purpose. Clients 0 ..
``attackers`` − 1 flood ``attack_factor`` × their honest estimate, validly formed, so nothing
but the size of the scalar gives them away: the attack
`seedflood.protocol.clipping.ScalarClip` bounds.
"""

from __future__ import annotations

from typing import Any

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.protocol.messages import Message


class PoisoningSeedFlood(SeedFlood):
    """SeedFlood whose first ``attackers`` clients scale their scalars by ``factor``."""

    def __init__(self, *, attackers: int, factor: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0 < attackers < self.n:
            raise ValueError(f"attackers must be in 1 .. {self.n - 1}, got {attackers}")
        self.attackers, self.factor = attackers, factor

    def make_message(self, step: int, client: int, scalar: float) -> Message:
        if client < self.attackers:
            scalar *= self.factor
        return super().make_message(step, client, scalar)
