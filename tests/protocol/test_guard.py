"""The divergence guard's two rules as pure functions of the committed scalars: a spike over the
trailing median, and a drift of the trailing median above its lowest level."""

from __future__ import annotations

import random
import statistics

import pytest

from seedflood.protocol.guard import DivergenceGuard, Tripped
from seedflood.protocol.messages import Message


def feed(guard: DivergenceGuard, means: list[float]) -> Tripped | None:
    """Each mean as one step of four clients' messages; the first refusal, if any."""
    for step, mean in enumerate(means):
        messages = [Message(step, origin, mean * sign) for origin, sign in enumerate((1, -1) * 2)]
        if tripped := guard.check(step, messages):
            return tripped
    return None


def drifting(flat: int = 200, rise: float = 1.01, steps: int = 400) -> list[float]:
    """Level 1.0 for ``flat`` steps, then up by ``rise`` a step: far too slow for a spike."""
    return [1.0] * flat + [rise ** (t + 1) for t in range(steps)]


def test_a_slow_drift_trips_the_drift_rule_where_the_median_passes_the_limit() -> None:
    means = drifting()
    tripped = feed(DivergenceGuard(8.0, 100, 20, drift=1.5, drift_window=50), means)
    assert tripped is not None and tripped.rule == "drift"
    # The 50-step median (the step itself included) first exceeds 1.5 × its lowest, 1.0, where
    # the 25th of the last 50 values does: rise^(t - 224) > 1.5.
    expected = next(
        t for t in range(70, len(means)) if statistics.median(means[t - 49 : t + 1]) > 1.5
    )
    assert tripped.step == expected
    assert tripped.reference == 1.0 and tripped.value > 1.5 and tripped.reference_step < 200
    assert "drifting" in tripped.explain(0.01) and f"step {expected - 1}" in tripped.explain(0.01)


def test_the_spike_rule_alone_lets_the_same_drift_through() -> None:
    assert feed(DivergenceGuard(8.0, 100, 20, drift=None), drifting()) is None


def test_a_blow_up_trips_the_spike_rule_first() -> None:
    tripped = feed(DivergenceGuard(8.0, 100, 20, drift=1.5), [1.0] * 100 + [2.0, 9.0])
    assert tripped is not None and (tripped.rule, tripped.step) == ("spike", 101)
    assert tripped.value == 9.0 and tripped.reference == 1.0
    assert tripped.to_json()["action"] == "stopped"


@pytest.mark.parametrize("seed", range(3))
def test_stationary_noise_as_wide_as_a_real_run_never_trips(seed: int) -> None:
    """SmolLM2's per-step means scatter with a log standard deviation of 0.25 while learning
    (results/long-sst2-lr0.01, steps 50-250); 3,000 such steps must pass."""
    rng = random.Random(seed)
    means = [rng.lognormvariate(0.0, 0.25) for _ in range(3000)]
    assert max(m / statistics.median(means) for m in means) > 2.0
    assert feed(DivergenceGuard(8.0, 100, 20, drift=1.5, drift_window=50), means) is None


def test_nothing_is_judged_before_the_warm_up() -> None:
    guard = DivergenceGuard(8.0, 100, warmup=20, drift=1.5, drift_window=50)
    assert feed(guard, [1.0] * 19 + [100.0]) is None  # the 20th step: 19 known, none judged
    early = DivergenceGuard(8.0, 100, warmup=20, drift=1.5, drift_window=50)
    assert feed(early, [1.0] * 20 + [100.0]) is not None


def test_two_guards_fed_the_same_steps_refuse_the_same_one() -> None:
    means = drifting(flat=120, rise=1.02)
    first = feed(DivergenceGuard(8.0, 100, 20, drift=1.5), means)
    assert first == feed(DivergenceGuard(8.0, 100, 20, drift=1.5), means) and first is not None


@pytest.mark.parametrize(
    "kwargs", [{"factor": 1.0}, {"factor": 8.0, "drift": 1.0}, {"factor": 8.0, "drift_window": 0}]
)
def test_limits_that_would_stop_a_flat_run_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="guard needs"):
        DivergenceGuard(**kwargs)
