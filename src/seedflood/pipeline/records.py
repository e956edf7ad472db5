"""The simulator's state and results, kept apart from the event loop that drives them.

The mutable records (a microbatch's progress, one relay's task, a wait on a silent relay, a
relay's life) are what routers read and the simulation updates; the frozen ones (trained
microbatches, iteration records, the compute account, the result) are what a run hands back.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from seedflood.pipeline.costs import Relay

MicrobatchKey = tuple[str, int]


@dataclass(eq=False)
class Microbatch:
    """Where each stage's work stands: the relay routed to, and who keeps the stage's output and
    gradient (a relay, or the holder itself for SWARM outputs); None = not there or lost."""

    holder: str
    index: int
    path: list[str | None]
    output_at: list[str | None]
    gradient_at: list[str | None]
    reached: int = -1
    pending: Task | Wait | None = None
    done: bool = False

    @property
    def key(self) -> MicrobatchKey:
        return (self.holder, self.index)


@dataclass(eq=False)
class Task:
    """One relay's turn on one stage of a microbatch: a forward, a backward, or both (the last
    stage turning round, a recovery, or SWARM's stateless backward). ``work`` is how its compute
    will be booked, (cause, seconds) per stage part as ``ledger.Ledger`` decides when it starts."""

    mb: Microbatch
    stage: int
    relay: str
    forward: bool
    backward: bool
    sent_s: float
    work: list[tuple[str, float]] = field(default_factory=list)
    started_s: float | None = None
    finished: bool = False
    failed: bool = False


@dataclass(eq=False)
class Wait:
    """A microbatch stuck on a relay that is gone, until its timeout notices."""

    relay: str


@dataclass(eq=False)
class RelayState:
    """A relay's life: its queue, the slots its kept activations take (``held``), and this
    iteration's finished tasks whose products it keeps (``kept``) and gradients, which a crash
    throws away."""

    relay: Relay
    alive_since: float
    idle_since: float | None
    ended_s: float | None = None
    crashed: bool = False
    leaving: bool = False
    current: Task | None = None
    queue: deque[Task] = field(default_factory=deque)
    waiting: deque[Task] = field(default_factory=deque)
    held: set[MicrobatchKey] = field(default_factory=set)
    kept: list[Task] = field(default_factory=list)
    gradients: list[tuple[MicrobatchKey, int]] = field(default_factory=list)


@dataclass(frozen=True)
class TrainedMicrobatch:
    """The relay per stage whose gradient for this microbatch entered the stage's average."""

    holder: str
    index: int
    path: tuple[str, ...]


@dataclass(frozen=True)
class IterationRecord:
    """One iteration: compute until ``compute_end_s``, then the all-reduce until ``end_s``.
    ``lost`` are admitted microbatches missing from some stage's average (SWARM only);
    ``events`` are the churn events that fell in it, with the reason when one was skipped or
    deferred (``deferred_from_s`` on a deferred one when it lands)."""

    index: int
    start_s: float
    compute_end_s: float
    end_s: float
    admitted: int
    trained: tuple[TrainedMicrobatch, ...]
    lost: tuple[MicrobatchKey, ...]
    duplicate_gradients: int
    events: tuple[dict[str, Any], ...]

    @property
    def microbatches(self) -> int:
        return len(self.trained)


@dataclass(frozen=True)
class ComputeAccount:
    """Relay-seconds by use; ``live_relay_s`` is the sum of the relays' lifetimes, which the
    four kinds add up to. ``waste`` splits recomputed and discarded time by cause (the causes
    are ``ledger``'s), so that a router's waste says what produced it."""

    useful_s: float
    recomputed_s: float
    discarded_s: float
    idle_s: float
    live_relay_s: float
    waste: dict[str, float] = field(default_factory=dict)

    @property
    def accounted_s(self) -> float:
        return self.useful_s + self.recomputed_s + self.discarded_s + self.idle_s


@dataclass(frozen=True)
class SimResult:
    router: str
    iterations: tuple[IterationRecord, ...]
    compute: ComputeAccount
    lifetimes: dict[str, tuple[float, float]]

    @property
    def total_time_s(self) -> float:
        return self.iterations[-1].end_s if self.iterations else 0.0

    @property
    def microbatches_trained(self) -> int:
        return sum(record.microbatches for record in self.iterations)

    @property
    def throughput(self) -> float:
        """Microbatches trained per second of wall time."""
        return self.microbatches_trained / self.total_time_s if self.total_time_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "total_time_s": self.total_time_s,
            "microbatches_trained": self.microbatches_trained,
            "throughput": self.throughput,
            "compute": asdict(self.compute),
            "lifetimes": {name: list(span) for name, span in self.lifetimes.items()},
            "iterations": [asdict(record) for record in self.iterations],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)
