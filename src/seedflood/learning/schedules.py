"""Learning-rate and ε schedules: the value at step t is a pure function of t and the config.

Every client, every real peer and every replay of a message log computes the update of a message
of step t with the rate of step t, so the rate must not depend on anything but t: no optimizer
state, no wall clock. The shapes are transformers' own (linear and cosine decay with warm-up);
their multiplier functions are read once from a throw-away scheduler and called directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")
EPS_SCHEDULES: tuple[str, ...] = ("constant", "cosine")
EPS_FLOOR = 0.1
"""A decaying ε ends at this fraction of its start: ε → 0 would divide the estimate by zero."""

_TRANSFORMERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class Schedule:
    """``base`` × transformers' multiplier for ``name`` at each step; picklable (checkpoints
    keep it), the multiplier function rebuilt on first use after unpickling."""

    def __init__(
        self,
        base: float,
        name: str = "constant",
        *,
        warmup: int = 0,
        total: int = 1,
        floor: float = 0.0,
    ) -> None:
        if name not in SCHEDULES:
            raise ValueError(f"schedule {name!r} is not one of {', '.join(SCHEDULES)}")
        self.base, self.name, self.warmup, self.total, self.floor = base, name, warmup, total, floor
        self._multiplier: Callable[[int], float] | None = None

    @property
    def constant(self) -> bool:
        return self.name == "constant" and self.warmup == 0

    def __call__(self, step: int) -> float:
        if self.constant:
            return self.base
        if self._multiplier is None:
            self._multiplier = _multiplier(self.name, self.warmup, self.total, self.floor)
        return self.base * self._multiplier(step)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_multiplier": None}

    def describe(self) -> dict[str, Any]:
        return {"schedule": self.name, "warmup": self.warmup, "total": self.total}


def _multiplier(name: str, warmup: int, total: int, floor: float) -> Callable[[int], float]:
    """transformers' multiplier function of step for ``name`` (cosine ends at ``floor``).
    Imported here: transformers' scheduler module pulls in peft, seconds that a constant-rate
    run (every real peer's start, every CLI call) need not pay."""
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    if name == "cosine" and floor > 0:
        scheduler = get_scheduler(
            "cosine_with_min_lr",
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=total,
            scheduler_specific_kwargs={"min_lr_rate": floor},
        )
    else:
        scheduler = get_scheduler(
            _TRANSFORMERS[name], optimizer, num_warmup_steps=warmup, num_training_steps=total
        )
    return scheduler.lr_lambdas[0]


Rate = Callable[[int], float]
"""A value by step: a `Schedule`, or any pure function of the step."""


def as_rate(value: float | Rate) -> Rate:
    """A constant given as a number, as a schedule; a schedule as it is."""
    return Schedule(float(value)) if isinstance(value, int | float) else value


class Settings(Protocol):
    """The run config's keys a schedule reads."""

    lr: float
    eps: float
    lr_schedule: str
    eps_schedule: str
    rounds: int

    @property
    def steps_per_round(self) -> int: ...

    @property
    def warmup(self) -> int: ...


def lr_schedule(config: Settings) -> Schedule:
    """The run's learning rate by step."""
    return Schedule(
        config.lr,
        config.lr_schedule,
        warmup=config.warmup,
        total=config.rounds * config.steps_per_round,
    )


def eps_schedule(config: Settings) -> Schedule:
    """The run's perturbation scale by step: constant, or cosine decay to EPS_FLOOR × ε."""
    return Schedule(
        config.eps,
        config.eps_schedule,
        total=config.rounds * config.steps_per_round,
        floor=EPS_FLOOR,
    )
