"""The divergence guard: stop a run before it commits a step that is blowing up or drifting.

A zeroth-order run diverges visibly in its scalars before its accuracy collapses, and the scalars
are what every client commits, so the guard reads them only. It has two rules, both from measured
runs (docs/reliability.md, "The divergence guard"):

- a *spike*: step t's mean |scalar| exceeds ``factor`` × the median of the last ``window``
  committed steps' means. The quickstart's 330-round H100 run blew up this way (1.1 → 3.3 → 12.1
  in 30 rounds).
- a *drift*: the median of the last ``drift_window`` steps' means (step t's included) exceeds
  ``drift`` × the lowest such median seen. A slow rise moves any trailing median with it, so this
  rule compares with the run's best level instead: SmolLM2 at lr 0.01 (results/long-sst2-lr0.01)
  lost 6.5 points of accuracy while its 50-step median rose 1.75× above its lowest, with no step
  over 2.8× the median before it.

Neither rule judges a step before ``warmup`` steps are known. Every client (simulated or a real
peer) commits the same steps in the same order, so every client refuses the same step, and the
run stops with the model of step t − 1: what its ledger holds, so a replay ends on the same hash.

Simulated DZSGD (full or LoRA) is guarded by the same rules on its clients' two-point scalars, so
its learning-rate grids stop a diverging rate as SeedFlood's do. Its clients apply each step as
they make it, so the guard reads a round's steps once the round is done and the run stops with
the models after the refused step (`seedflood.algorithms.gossip`). That is a simulator's view of
all clients at once; gossip peers, each seeing its own scalars only, would have no such rule.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

from seedflood.protocol.messages import Message

GUARD_FACTOR = 8.0
"""The default spike limit, from measured runs: see docs/reliability.md."""
GUARD_DRIFT = 1.5
"""The default drift limit, from the SmolLM2 runs: see docs/reliability.md."""


@dataclass(frozen=True)
class Tripped:
    """Why the guard refused step ``step``: ``value`` went over ``factor`` × ``reference``."""

    step: int
    rule: Literal["spike", "drift"]
    value: float
    reference: float
    reference_step: int
    factor: float
    window: int

    def explain(self, lr: float, kept: str | None = None) -> str:
        """Why the run stopped, and what it kept: ``kept`` names the model it stopped with where
        that is not the model of the step before (gossip clients apply a step as they make it)."""
        ratio = self.value / self.reference if self.reference else float("inf")
        if self.rule == "spike":
            what = (
                f"step {self.step}'s mean |scalar| {self.value:.4g} is {ratio:.1f}× the median of "
                f"the {self.window} steps before ({self.reference:.4g}, limit {self.factor:g}×)"
            )
        else:
            what = (
                f"the median mean |scalar| of the {self.window} steps to {self.step} "
                f"({self.value:.4g}) is {ratio:.2f}× its lowest ({self.reference:.4g}, at step "
                f"{self.reference_step}; limit guard_drift {self.factor:g}×): the run is drifting"
            )
        kept = kept or f"the model of step {self.step - 1}"
        return (
            f"divergence guard: {what}; the run stopped with {kept}. Lower the learning rate "
            f"(lr {lr:g} at this step), or decay it (lr_schedule: cosine); guard_factor: null "
            "turns the guard off"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "action": "stopped",
            "rule": self.rule,
            "step": self.step,
            "value": self.value,
            "reference": self.reference,
            "reference_step": self.reference_step,
            "factor": self.factor,
            "window": self.window,
        }


class DivergenceGuard:
    """The rules above as pure state, fed every step's messages in commit order."""

    def __init__(
        self,
        factor: float,
        window: int = 100,
        warmup: int = 20,
        drift: float | None = None,
        drift_window: int = 50,
    ) -> None:
        if factor <= 1 or window < 1 or not 1 <= warmup <= window:
            raise ValueError(
                f"guard needs factor > 1 and 1 <= warmup <= window; got factor {factor}, "
                f"window {window}, warmup {warmup}"
            )
        if (drift is not None and drift <= 1) or drift_window < 1:
            raise ValueError(
                f"guard needs drift > 1 and drift_window >= 1; got {drift}, {drift_window}"
            )
        self.factor, self.window, self.warmup = factor, window, warmup
        self.drift, self.drift_window = drift, drift_window
        self.means: deque[float] = deque(maxlen=max(window, drift_window))
        self.seen = 0
        self.lowest: tuple[float, int] | None = None  # (the lowest drift median, its step)

    @classmethod
    def from_config(cls, config: Any) -> DivergenceGuard | None:
        if config.guard_factor is None:
            return None
        return cls(
            config.guard_factor,
            config.guard_window,
            config.guard_warmup,
            config.guard_drift,
            config.guard_drift_window,
        )

    def _last(self, count: int) -> list[float]:
        return list(islice(self.means, max(0, len(self.means) - count), None))

    def check(self, step: int, messages: Sequence[Message]) -> Tripped | None:
        """None, remembering the step, if it may be committed; else why not."""
        return self.check_scalars(step, [m.scalar for m in messages])

    def check_scalars(self, step: int, scalars: Sequence[float]) -> Tripped | None:
        """``check`` of a step given as its clients' scalars (a gossip run sends no messages)."""
        mean = sum(abs(s) for s in scalars) / len(scalars)
        if self.seen >= self.warmup:
            median = statistics.median(self._last(self.window))
            if mean > self.factor * median:
                return Tripped(step, "spike", mean, median, step - 1, self.factor, self.window)
        drift_median = None
        if self.drift is not None and self.seen + 1 >= self.warmup + self.drift_window:
            drift_median = statistics.median([*self._last(self.drift_window - 1), mean])
            if self.lowest is not None and drift_median > self.drift * self.lowest[0]:
                lowest, at = self.lowest
                return Tripped(
                    step, "drift", drift_median, lowest, at, self.drift, self.drift_window
                )
        self.means.append(mean)
        self.seen += 1
        if drift_median is not None and (self.lowest is None or drift_median < self.lowest[0]):
            self.lowest = (drift_median, step)
        return None


def guard_record(guard: DivergenceGuard | None, tripped: Tripped | None) -> dict[str, Any]:
    """What results.json says the guard did: stopped (and why), nothing, or off."""
    if tripped is not None:
        return tripped.to_json()
    return {"action": "none" if guard is not None else "off"}
