"""Churn schedules for the pipeline simulator: crashes, graceful leaves, joins, degraded links.

A schedule is a time-ordered list of events in simulated seconds. Generated schedules draw every
kind from a Poisson process whose rate scales with the relays that could be hit, so one seed gives
one schedule and every router faces the same one (DESIGN.md §3: "same churn schedule"). A router
that trains faster simply lives through fewer of its events.

The model assumes at least one live relay per stage, as GWTF does (gwtf.md §8): the generator
never schedules the crash or departure of a stage's last remaining relay, and the simulator defers
(and records) any event that would still do it, e.g. after SWARM moved relays between stages,
until a joiner or a rebalancing gives that stage another relay.
Data holders never churn: they own the data and are the sources every microbatch starts from.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

from seedflood.pipeline.costs import Relay, Scenario, ScenarioError


@dataclass(frozen=True)
class Crash:
    """The relay stops at once; whatever it computes or keeps is gone."""

    time_s: float
    relay: str


@dataclass(frozen=True)
class Leave:
    """The relay takes no new work, finishes the iteration's work it holds, then departs."""

    time_s: float
    relay: str


@dataclass(frozen=True)
class Join:
    """A new relay; the router picks its stage, and it starts serving at the next iteration
    (after fetching that stage's parameters)."""

    time_s: float
    name: str
    compute_s: float
    capacity: int
    region: str


@dataclass(frozen=True)
class Degrade:
    """The bandwidth between two regions is divided by ``factor`` for ``duration_s``."""

    time_s: float
    regions: tuple[str, str]
    factor: float
    duration_s: float


ChurnEvent = Crash | Leave | Join | Degrade


def describe(event: ChurnEvent) -> dict[str, Any]:
    """A JSON-ready form that names the event's kind."""
    return {"type": type(event).__name__.lower(), **asdict(event)}


@dataclass(frozen=True)
class ChurnRates:
    """Event rates. Crashes and leaves are per relay-hour of every relay that may go; joins are
    per relay-hour of the scenario's initial relay count, so equal join and loss rates keep the
    population steady; degradations are per hour for the whole network."""

    crash_per_relay_hour: float = 0.0
    leave_per_relay_hour: float = 0.0
    join_per_relay_hour: float = 0.0
    degrade_per_hour: float = 0.0
    degrade_factor: float = 10.0
    degrade_duration_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("crash_per_relay_hour", "leave_per_relay_hour", "join_per_relay_hour"):
            if getattr(self, name) < 0:
                raise ScenarioError(f"{name} must be >= 0; got {getattr(self, name)}")
        if self.degrade_per_hour < 0 or self.degrade_factor < 1 or self.degrade_duration_s <= 0:
            raise ScenarioError(
                "degrade_per_hour must be >= 0, degrade_factor >= 1 and degrade_duration_s > 0"
            )

    @classmethod
    def per_iteration(
        cls,
        *,
        iteration_s: float,
        crash: float = 0.0,
        leave: float = 0.0,
        join: float = 0.0,
        degrade: float = 0.0,
        degrade_factor: float = 10.0,
        degrade_duration_s: float = 120.0,
    ) -> ChurnRates:
        """Rates given per relay-iteration (per iteration for degradations), converted with an
        expected iteration length because the simulator's clock is in seconds."""
        if iteration_s <= 0:
            raise ScenarioError(f"iteration_s must be > 0; got {iteration_s}")
        per_hour = 3600.0 / iteration_s
        return cls(
            crash_per_relay_hour=crash * per_hour,
            leave_per_relay_hour=leave * per_hour,
            join_per_relay_hour=join * per_hour,
            degrade_per_hour=degrade * per_hour,
            degrade_factor=degrade_factor,
            degrade_duration_s=degrade_duration_s,
        )


# "low" uses the highest hourly failure rate of the CheckFree simulator (33 % per node-hour,
# gwtf.md §6.2); "high" is ten times as harsh, with frequent joins and link trouble.
PRESETS: dict[str, ChurnRates] = {
    "none": ChurnRates(),
    "low": ChurnRates(0.33, 0.17, 0.5, degrade_per_hour=2.0),
    "high": ChurnRates(3.0, 1.5, 4.5, degrade_per_hour=20.0),
}


def resolve_rates(rates: ChurnRates | str) -> ChurnRates:
    """Rates as given, a preset by name, or a number as text: that many crashes per relay-hour
    with as many joins (a steady population), for sweeps past the presets."""
    if isinstance(rates, ChurnRates):
        return rates
    if rates in PRESETS:
        return PRESETS[rates]
    try:
        rate = float(rates)
    except ValueError:
        rate = math.nan
    if not 0 <= rate < math.inf:
        raise ScenarioError(
            f"churn {rates!r} is neither a preset ({', '.join(PRESETS)}) nor a number of "
            "crashes per relay-hour >= 0"
        )
    return ChurnRates(crash_per_relay_hour=rate, join_per_relay_hour=rate)


def bottleneck_stage(
    relays: Iterable[Relay], stages: int, by: Literal["capacity", "throughput"]
) -> int:
    """The stage a newcomer should lift: least total capacity (microbatches per iteration, what
    bounds GWTF's flow) or least compute throughput (microbatches per second, SWARM's "most
    loaded"), the other measure breaking ties, then the lower index."""
    capacity = [0] * stages
    throughput = [0.0] * stages
    for relay in relays:
        capacity[relay.stage] += relay.capacity
        throughput[relay.stage] += 1.0 / relay.compute_s
    if by == "capacity":
        return min(range(stages), key=lambda s: (capacity[s], throughput[s], s))
    return min(range(stages), key=lambda s: (throughput[s], capacity[s], s))


def churn_events(scenario: Scenario, rates: ChurnRates, seed: int) -> Iterator[ChurnEvent]:
    """An endless seeded stream of events (empty when every rate is zero). Joiners resemble the
    scenario's relays: compute and capacity drawn within its ranges, regions among its nodes'."""
    rng = random.Random(f"churn:{seed}")
    live = {relay.name: relay for relay in scenario.relays}
    regions = sorted({node.region for node in scenario.nodes.values()})
    speeds = [relay.compute_s for relay in scenario.relays]
    capacities = [relay.capacity for relay in scenario.relays]
    join_rate = rates.join_per_relay_hour * len(scenario.relays) / 3600.0
    degrade_rate = rates.degrade_per_hour / 3600.0
    time_s = 0.0
    joined = 0
    while True:
        per_stage = [0] * scenario.stages
        for relay in live.values():
            per_stage[relay.stage] += 1
        removable = sorted(name for name, relay in live.items() if per_stage[relay.stage] > 1)
        crash_rate = rates.crash_per_relay_hour * len(removable) / 3600.0
        leave_rate = rates.leave_per_relay_hour * len(removable) / 3600.0
        total = crash_rate + leave_rate + join_rate + degrade_rate
        if total <= 0:
            return
        time_s += rng.expovariate(total)
        draw = rng.uniform(0.0, total)
        if draw < crash_rate + leave_rate:
            name = rng.choice(removable)
            del live[name]
            yield Crash(time_s, name) if draw < crash_rate else Leave(time_s, name)
        elif draw < crash_rate + leave_rate + join_rate:
            joiner = Join(
                time_s,
                f"join{joined}",
                rng.uniform(min(speeds), max(speeds)),
                rng.randint(min(capacities), max(capacities)),
                rng.choice(regions),
            )
            joined += 1
            stage = bottleneck_stage(live.values(), scenario.stages, by="capacity")
            live[joiner.name] = Relay(
                joiner.name, stage, joiner.compute_s, joiner.capacity, joiner.region
            )
            yield joiner
        else:
            pair = rng.sample(regions, 2) if len(regions) > 1 else regions * 2
            yield Degrade(
                time_s, (pair[0], pair[1]), rates.degrade_factor, rates.degrade_duration_s
            )


@dataclass(frozen=True)
class ChurnSchedule:
    """A finite, explicit schedule (sorted by time on construction)."""

    events: tuple[ChurnEvent, ...] = ()

    def __post_init__(self) -> None:
        for event in self.events:
            if event.time_s < 0:
                raise ScenarioError(f"churn event at negative time: {describe(event)}")
        object.__setattr__(self, "events", tuple(sorted(self.events, key=lambda e: e.time_s)))

    def __iter__(self) -> Iterator[ChurnEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    @classmethod
    def generate(
        cls, scenario: Scenario, rates: ChurnRates | str, *, seed: int, horizon_s: float
    ) -> ChurnSchedule:
        events = []
        for event in churn_events(scenario, resolve_rates(rates), seed):
            if event.time_s > horizon_s:
                break
            events.append(event)
        return cls(tuple(events))

    def to_dicts(self) -> list[dict[str, Any]]:
        return [describe(event) for event in self.events]
