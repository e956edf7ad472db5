"""SWARM parallelism's routing (Ryabinin et al. 2023; gwtf.md §9), the baseline GWTF is measured
against.

Each trainer (data holder) keeps, per stage, its servers keyed by accumulated expected busy time; a
request goes to the server with the least, whose key then grows by task size / its measured
throughput, an exponential moving average (α = 0.1, bias-corrected like hivemind's
PerformanceEMA) of request round trips. Requests thus spread in proportion to observed throughput,
without any notion of which links between servers are fast. Newcomers enter at the current
minimum key so they get probed. A failed server is banned and the request retried on another.

Every ``rebalance_every`` iterations one relay moves from the stage with the most compute
throughput to the one with the least, if that raises the pipeline's minimum stage throughput
(SWARM §3.3; the public prototype lacks this part). The move must also not lower the smallest
stage capacity, so the batch trained per iteration never shrinks because of a rebalance. Moves
happen between iterations; the download of the new stage's parameters is not timed.

The public prototype routes every hop through the trainer (trainer → server → trainer, twice the
activation traffic, the trainer's links on every hop); the SWARM paper wires servers to each
other. ``SwarmDirectRouter`` is that variant: the same trainer-side choices, with activations going
server → server, so comparing the two separates what GWTF gains by choosing links from what it
gains by not detouring through the trainer.

Like every router, SWARM's sees the simulation only through routing.RoutingView: choosing a
server reads nothing but which servers are usable; what it learns comes from replies and failures.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from seedflood.pipeline.churn import Join, bottleneck_stage
from seedflood.pipeline.costs import NoRelayLeft, Relay, Scenario

if TYPE_CHECKING:
    from seedflood.pipeline.records import Microbatch, Task
    from seedflood.pipeline.routing import RoutingView

EMA_ALPHA = 0.1
FORWARD_TASK_SIZE = 1.0
# A stateless backward re-runs the stage forward (1) before the backward proper (2).
BACKWARD_TASK_SIZE = 3.0


class ThroughputEma:
    """Bias-corrected EMA, so that the first samples are not dragged towards zero."""

    def __init__(self, alpha: float = EMA_ALPHA) -> None:
        self.alpha = alpha
        self.value = 0.0
        self.weight = 0.0

    def update(self, sample: float) -> None:
        self.value = self.alpha * sample + (1 - self.alpha) * self.value
        self.weight = self.alpha + (1 - self.alpha) * self.weight

    @property
    def estimate(self) -> float | None:
        return self.value / self.weight if self.weight else None


class StageBalancer:
    """One trainer's view of one stage's servers."""

    def __init__(self, names: Iterable[str], rng: random.Random) -> None:
        self.rng = rng
        self.keys: dict[str, float] = {}
        self.emas: dict[str, ThroughputEma] = {}
        self.banned: set[str] = set()
        self.sync(names)

    def sync(self, names: Iterable[str]) -> None:
        """Follow membership changes (joins, departures, rebalancing moves)."""
        wanted = list(names)
        for name in [n for n in self.keys if n not in wanted]:
            del self.keys[name]
            del self.emas[name]
        for name in wanted:
            if name not in self.keys:
                self.keys[name] = min(self.keys.values(), default=0.0)
                self.emas[name] = ThroughputEma()

    def throughput(self, name: str) -> float:
        """Unmeasured servers are assumed as fast as the stage's measured mean."""
        own = self.emas[name].estimate
        if own is not None:
            return own
        known = [e.estimate for e in self.emas.values() if e.estimate is not None]
        return sum(known) / len(known) if known else 1.0

    def choose(self, task_size: float, usable: Callable[[str], bool], stage: int) -> str:
        candidates = [n for n in self.keys if n not in self.banned and usable(n)]
        if not candidates:
            raise NoRelayLeft(stage)
        least = min(self.keys[n] for n in candidates)
        name = self.rng.choice(sorted(n for n in candidates if self.keys[n] == least))
        self.keys[name] += task_size / self.throughput(name)
        return name

    def observe(self, name: str, task_size: float, elapsed_s: float) -> None:
        if name in self.emas and elapsed_s > 0:
            self.emas[name].update(task_size / elapsed_s)

    def ban(self, name: str) -> None:
        self.banned.add(name)


def _stage_totals(relays: Iterable[Relay], stages: int) -> tuple[list[float], list[int]]:
    throughput = [0.0] * stages
    capacity = [0] * stages
    for relay in relays:
        throughput[relay.stage] += 1.0 / relay.compute_s
        capacity[relay.stage] += relay.capacity
    return throughput, capacity


def rebalance(scenario: Scenario) -> Scenario | None:
    """The scenario with one relay moved to the bottleneck stage, or None if no move helps."""
    throughput, capacity = _stage_totals(scenario.relays, scenario.stages)
    donor = max(range(scenario.stages), key=lambda s: (throughput[s], -s))
    if len(scenario.stage(donor)) < 2:
        return None
    receiver = min(range(scenario.stages), key=lambda s: (throughput[s], s))
    options = []
    for relay in scenario.stage(donor):
        moved = [replace(r, stage=receiver) if r is relay else r for r in scenario.relays]
        new_throughput, new_capacity = _stage_totals(moved, scenario.stages)
        gain = min(new_throughput) - min(throughput)
        if gain > 1e-12 and min(new_capacity) >= min(capacity):
            options.append((-gain, relay.name))
    if not options:
        return None
    _, chosen = min(options)
    return scenario.with_relays(
        tuple(replace(r, stage=receiver) if r.name == chosen else r for r in scenario.relays)
    )


def admitted_microbatches(scenario: Scenario) -> list[str]:
    """Which holder each microbatch of the iteration comes from: as many as the smallest stage
    capacity allows (the batch a perfect flow would route, so both routers train the same batch),
    taken round-robin over holders."""
    _, capacity = _stage_totals(scenario.relays, scenario.stages)
    budget = min(sum(h.microbatches for h in scenario.holders), min(capacity))
    left = {h.name: h.microbatches for h in scenario.holders}
    order: list[str] = []
    while len(order) < budget:
        for holder in scenario.holders:
            if left[holder.name] and len(order) < budget:
                left[holder.name] -= 1
                order.append(holder.name)
    return order


class SwarmRouter:
    """Stateless, trainer-centric routing: every hop goes trainer → server → trainer."""

    name = "swarm"
    stateful = False
    hub = True

    def __init__(self, scenario: Scenario, *, rebalance_every: int, seed: int) -> None:
        self.rebalance_every = rebalance_every
        self.balancers = {
            holder.name: [
                StageBalancer(
                    (r.name for r in scenario.stage(stage)),
                    random.Random(f"swarm:{seed}:{holder.name}:{stage}"),
                )
                for stage in range(scenario.stages)
            ]
            for holder in scenario.holders
        }

    def begin_iteration(
        self, scenario: Scenario, iteration: int
    ) -> tuple[Scenario, list[tuple[str, tuple[str | None, ...]]]]:
        if self.rebalance_every and iteration and iteration % self.rebalance_every == 0:
            scenario = rebalance(scenario) or scenario
        for stages in self.balancers.values():
            for stage, balancer in enumerate(stages):
                balancer.sync(r.name for r in scenario.stage(stage))
        unrouted = (None,) * scenario.stages
        return scenario, [(holder, unrouted) for holder in admitted_microbatches(scenario)]

    def place(self, joiner: Join, scenario: Scenario) -> int:
        return bottleneck_stage(scenario.relays, scenario.stages, by="throughput")

    def choose(self, mb: Microbatch, stage: int, forward_only: bool, view: RoutingView) -> str:
        size = FORWARD_TASK_SIZE if forward_only else BACKWARD_TASK_SIZE
        return self.balancers[mb.holder][stage].choose(size, view.usable, stage)

    def observe(self, task: Task, elapsed_s: float) -> None:
        size = BACKWARD_TASK_SIZE if task.backward else FORWARD_TASK_SIZE
        self.balancers[task.mb.holder][task.stage].observe(task.relay, size, elapsed_s)

    def failed(self, mb: Microbatch, relay: str, stage: int) -> None:
        self.balancers[mb.holder][stage].ban(relay)


class SwarmDirectRouter(SwarmRouter):
    """SWARM's stateless routing with servers wired to each other: the trainer still picks every
    server, but a stage's output goes straight to the next stage's server, and its sender keeps it
    for the stateless backward there."""

    name = "swarm-direct"
    hub = False
