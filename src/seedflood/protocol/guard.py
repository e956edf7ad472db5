"""The divergence guard: stop a run before it commits a step that is blowing up.

A zeroth-order run diverges visibly in its scalars before its accuracy collapses: on the
quickstart's 330-round H100 run the mean |scalar| of a step went 1.1 → 3.3 → 12.1 while the train
loss tripled. The scalars are what every client commits, so the rule reads them only: step t is
refused when its mean |scalar| exceeds ``factor`` × the median of the last ``window`` committed
steps' means (once ``warmup`` steps are known). Every client (simulated or a real peer) commits
the same steps in the same order, so every client refuses the same step, and the run stops with
the model of step t − 1: what its ledger holds, so a replay ends on the same hash.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seedflood.protocol.messages import Message

GUARD_FACTOR = 8.0
"""The default limit, from measured runs: see docs/reliability.md ("The divergence guard")."""


@dataclass(frozen=True)
class Tripped:
    """Why the guard refused step ``step``."""

    step: int
    mean_abs_scalar: float
    median: float
    factor: float
    window: int

    def explain(self, lr: float) -> str:
        ratio = self.mean_abs_scalar / self.median if self.median else float("inf")
        return (
            f"divergence guard: step {self.step}'s mean |scalar| {self.mean_abs_scalar:.4g} is "
            f"{ratio:.1f}× the median of the last {self.window} "
            f"steps ({self.median:.4g}, limit {self.factor:g}×); the run stopped with the model "
            f"of step {self.step - 1}. Lower the learning rate (lr {lr:g}), or decay it "
            "(lr_schedule: cosine); guard_factor: null turns the guard off"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "action": "stopped",
            "step": self.step,
            "mean_abs_scalar": self.mean_abs_scalar,
            "median": self.median,
            "factor": self.factor,
            "window": self.window,
        }


class DivergenceGuard:
    """The rule above as pure state, fed every step's messages in commit order."""

    def __init__(self, factor: float, window: int = 100, warmup: int = 20) -> None:
        if factor <= 1 or window < 1 or not 1 <= warmup <= window:
            raise ValueError(
                f"guard needs factor > 1 and 1 <= warmup <= window; got factor {factor}, "
                f"window {window}, warmup {warmup}"
            )
        self.factor, self.window, self.warmup = factor, window, warmup
        self.means: deque[float] = deque(maxlen=window)

    @classmethod
    def from_config(cls, config: Any) -> DivergenceGuard | None:
        if config.guard_factor is None:
            return None
        return cls(config.guard_factor, config.guard_window, config.guard_warmup)

    def check(self, step: int, messages: Sequence[Message]) -> Tripped | None:
        """None, remembering the step, if it may be committed; else why not."""
        mean = sum(abs(m.scalar) for m in messages) / len(messages)
        if len(self.means) >= self.warmup:
            median = statistics.median(self.means)
            if mean > self.factor * median:
                return Tripped(step, mean, median, self.factor, self.window)
        self.means.append(mean)
        return None


def guard_record(guard: DivergenceGuard | None, tripped: Tripped | None) -> dict[str, Any]:
    """What results.json says the guard did: stopped (and why), nothing, or off."""
    if tripped is not None:
        return tripped.to_json()
    return {"action": "none" if guard is not None else "off"}
