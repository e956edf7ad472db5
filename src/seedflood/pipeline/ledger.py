"""Where every relay-second of a simulation goes, and why the wasted ones were wasted.

A second of a live relay is useful, recomputed, discarded or idle (``records.ComputeAccount``).
Recomputed and discarded time is broken down by cause, so that a router's waste can be traced to
what produced it rather than inferred from the totals:

- ``re-forward``: the stage forward a stateless (SWARM) backward runs again by design;
- ``recovery``: a stage forward or backward run again because a crash lost the first run;
- ``crashed task``: the part of a task in progress when its relay crashed;
- ``crashed products``: finished work whose product (kept activations, accumulated gradients)
  died with its relay this iteration;
- ``dropped microbatch``: work on a microbatch missing from some stage's average at the end of
  the iteration (SWARM, when a server died holding its gradient). The simulator counts such a
  microbatch as not trained, so all the work that went into it was for nothing; left useful, it
  would charge GWTF (which recomputes the lost stage) for work SWARM is not charged for.

Work is booked when a task finishes; a cause moves to ``crashed products`` or ``dropped
microbatch`` when its product is lost, so the causes always add up to the four totals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from seedflood.pipeline.records import ComputeAccount, MicrobatchKey, Task

USEFUL = "useful"
REFORWARD = "re-forward"
RECOVERY = "recovery"
CRASHED_TASK = "crashed task"
CRASHED_PRODUCTS = "crashed products"
DROPPED = "dropped microbatch"
RECOMPUTED = (REFORWARD, RECOVERY)
DISCARDED = (CRASHED_TASK, CRASHED_PRODUCTS, DROPPED)


class Ledger:
    """Relay-seconds by cause, and this iteration's finished work per microbatch (which a later
    loss of the microbatch turns into waste)."""

    def __init__(self) -> None:
        self.idle_s = 0.0
        self.booked: Counter[str] = Counter()
        self._started: set[tuple[str, int, int, str]] = set()
        self._standing: dict[MicrobatchKey, list[Task]] = {}

    def start(self, task: Task, compute_s: float, *, stateless: bool) -> float:
        """Decide how ``task``'s compute will be booked and return how long it runs. A stage part
        already started this iteration is recomputed: by design when a stateless backward runs
        the forward again, else because a crash lost the first run."""
        parts = [("forward", compute_s)] if task.forward else []
        parts += [("backward", 2 * compute_s)] if task.backward else []
        for part, seconds in parts:
            key = (*task.mb.key, task.stage, part)
            if key not in self._started:
                cause = USEFUL
            elif stateless and part == "forward" and task.backward:
                cause = REFORWARD
            else:
                cause = RECOVERY
            task.work.append((cause, seconds))
            self._started.add(key)
        return sum(seconds for _, seconds in parts)

    def idle(self, seconds: float) -> None:
        self.idle_s += seconds

    def interrupted(self, seconds: float) -> None:
        """A crash cut a task short after ``seconds`` of compute."""
        self.booked[CRASHED_TASK] += seconds

    def done(self, task: Task) -> None:
        for cause, seconds in task.work:
            self.booked[cause] += seconds
        self._standing.setdefault(task.mb.key, []).append(task)

    def lose(self, tasks: Iterable[Task]) -> None:
        """Finished tasks whose products died with their relay."""
        for task in tasks:
            self._standing[task.mb.key].remove(task)
            self._discard(task, CRASHED_PRODUCTS)

    def drop(self, keys: Iterable[MicrobatchKey]) -> None:
        """Microbatches left out of the iteration's averages: their surviving work was wasted."""
        for key in keys:
            for task in self._standing.pop(key, []):
                self._discard(task, DROPPED)

    def new_iteration(self) -> None:
        self._started.clear()
        self._standing.clear()

    def account(self, live_relay_s: float) -> ComputeAccount:
        waste = {cause: self.booked[cause] for cause in (*RECOMPUTED, *DISCARDED)}
        return ComputeAccount(
            self.booked[USEFUL],
            sum(waste[cause] for cause in RECOMPUTED),
            sum(waste[cause] for cause in DISCARDED),
            self.idle_s,
            live_relay_s=live_relay_s,
            waste=waste,
        )

    def _discard(self, task: Task, cause: str) -> None:
        for booked_as, seconds in task.work:
            self.booked[booked_as] -= seconds
            self.booked[cause] += seconds
