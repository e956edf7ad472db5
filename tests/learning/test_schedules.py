"""Rates by step: transformers' shapes, pure in the step, the same after a checkpoint's pickle,
and a warm-up given as a ratio that scales with the run."""

from __future__ import annotations

import math
import pickle

import pytest
from pydantic import ValidationError

from seedflood.config import RunConfig
from seedflood.learning.schedules import EPS_FLOOR, Schedule, eps_schedule, lr_schedule


def test_cosine_warms_up_linearly_then_decays_to_zero() -> None:
    rate = Schedule(0.01, "cosine", warmup=10, total=110)
    assert rate(0) == 0.0 and rate(5) == pytest.approx(0.005) and rate(10) == pytest.approx(0.01)
    assert rate(60) == pytest.approx(0.005)  # half-way through the decay: cos(π/2)
    assert rate(110) == pytest.approx(0.0, abs=1e-12)
    assert all(rate(t) >= rate(t + 1) for t in range(10, 110))


def test_linear_and_constant_shapes() -> None:
    assert Schedule(0.2, "linear", total=100)(25) == pytest.approx(0.15)
    assert Schedule(0.2)(10**6) == 0.2
    constant = Schedule(0.2, "constant", warmup=4, total=100)
    assert [constant(t) for t in (0, 2, 4, 99)] == pytest.approx([0.0, 0.1, 0.2, 0.2])


def test_a_schedule_is_pure_in_the_step_and_survives_a_pickle() -> None:
    rate = Schedule(0.01, "cosine", warmup=7, total=300)
    forward = [rate(t) for t in range(300)]
    again = pickle.loads(pickle.dumps(rate))
    assert [again(t) for t in reversed(range(300))] == forward[::-1]


def test_eps_decays_to_its_floor_and_lr_follows_the_config() -> None:
    config = RunConfig(
        rounds=200, lr=0.004, lr_schedule="cosine", warmup_ratio=0.05, eps_schedule="cosine"
    )
    assert config.warmup == 10
    lr = lr_schedule(config)
    assert lr(10) == pytest.approx(0.004) and lr(9) < 0.004
    eps = eps_schedule(config)
    assert eps(0) == pytest.approx(config.eps)
    assert eps(200) == pytest.approx(EPS_FLOOR * config.eps)


@pytest.mark.parametrize("rounds", [30, 1000, 4999])
def test_a_warmup_ratio_rounds_up_as_transformers_does(rounds: int) -> None:
    assert RunConfig(rounds=rounds, warmup_ratio=0.05).warmup == math.ceil(0.05 * rounds)


def test_a_warmup_ratio_leaves_a_short_run_a_step_to_learn() -> None:
    assert RunConfig(rounds=1, warmup_ratio=0.05).warmup == 0
    assert RunConfig(rounds=2, warmup_ratio=0.9).warmup == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"warmup_steps": 5, "warmup_ratio": 0.1}, "both set the warm-up"),
        ({"warmup_steps": 30}, r"'warmup_steps' \(30\) must be below the run's steps"),
        ({"warmup_ratio": 1.0}, "less than 1"),
    ],
)
def test_a_warmup_that_cannot_be_is_refused_by_name(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RunConfig(rounds=30, **overrides)
