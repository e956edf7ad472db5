"""How simulated microbatches are routed: the interface GWTF and SWARM share, and GWTF's side.

The simulation leaves every routing decision to a ``Router``: which microbatches an iteration
admits, where a joining relay serves, which relay a stage's task goes to, and what is learnt
from replies and failures. SWARM's router lives in swarm.py; GWTF's, which follows an injected
planner's paths once they are checked against the scenario, lives here with the interface.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from seedflood.pipeline.churn import Join, bottleneck_stage
from seedflood.pipeline.costs import Relay, Scenario, ScenarioError
from seedflood.pipeline.records import Microbatch, Task

if TYPE_CHECKING:
    from seedflood.pipeline.simulation import Simulation

Planner = Callable[[Scenario], Sequence[tuple[str, ...]]]


class Router(Protocol):
    """What differs between GWTF and SWARM. ``stateful`` routers keep activations on relays and
    pass them relay to relay; stateless ones route every hop through the data holder."""

    stateful: bool

    def begin_iteration(
        self, scenario: Scenario, iteration: int
    ) -> tuple[Scenario, list[tuple[str, tuple[str | None, ...]]]]: ...

    def place(self, joiner: Join, scenario: Scenario) -> int: ...

    def choose(self, mb: Microbatch, stage: int, forward_only: bool, sim: Simulation) -> str: ...

    def observe(self, task: Task, elapsed_s: float) -> None: ...

    def failed(self, mb: Microbatch, relay: str, stage: int) -> None: ...


def check_plan(scenario: Scenario, paths: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """A planner's paths, refused loudly if they could not run on ``scenario``."""
    per_holder: Counter[str] = Counter()
    per_relay: Counter[str] = Counter()
    holders = {h.name: h for h in scenario.holders}
    for path in paths:
        if len(path) != scenario.stages + 1 or path[0] not in holders:
            raise ScenarioError(f"plan path {path} is not (holder, one relay per stage)")
        for stage, name in enumerate(path[1:]):
            node = scenario.nodes.get(name)
            if not isinstance(node, Relay) or node.stage != stage:
                raise ScenarioError(f"plan path {path}: {name!r} does not serve stage {stage}")
        per_holder[path[0]] += 1
        per_relay.update(path[1:])
    for name, count in per_holder.items():
        if count > holders[name].microbatches:
            raise ScenarioError(f"plan routes {count} microbatches from holder {name!r}")
    for name, count in per_relay.items():
        relay = scenario.nodes[name]
        if isinstance(relay, Relay) and count > relay.capacity:
            raise ScenarioError(f"plan gives {count} microbatches to {name!r} ({relay.capacity})")
    return list(paths)


class GwtfRouter:
    """Stateful relay-to-relay routing along a planned flow, with one-stage crash recovery."""

    stateful = True

    def __init__(self, plan: Planner) -> None:
        self.plan = plan
        self._planned: tuple[Scenario, list[tuple[str, ...]]] | None = None

    def begin_iteration(
        self, scenario: Scenario, iteration: int
    ) -> tuple[Scenario, list[tuple[str, tuple[str | None, ...]]]]:
        if self._planned is None or self._planned[0] != scenario:
            self._planned = (scenario, check_plan(scenario, self.plan(scenario)))
        return scenario, [(path[0], tuple(path[1:])) for path in self._planned[1]]

    def place(self, joiner: Join, scenario: Scenario) -> int:
        return bottleneck_stage(scenario.relays, scenario.stages, by="capacity")

    def choose(self, mb: Microbatch, stage: int, forward_only: bool, sim: Simulation) -> str:
        planned = mb.path[stage]
        if planned is not None and planned not in sim.known_dead:
            return planned
        before = mb.path[stage - 1] if stage else mb.holder
        after = mb.path[stage + 1] if stage + 1 < len(mb.path) else None

        def cost(name: str) -> float:
            ends = [end for end in (before, after) if end is not None]
            return sum(sim.scenario.edge_cost(end, name) for end in ends)

        candidates = [r.name for r in sim.scenario.stage(stage) if sim.usable(r.name)]
        return min(candidates, key=lambda name: (not sim.has_free_slot(name), cost(name), name))

    def observe(self, task: Task, elapsed_s: float) -> None:
        """GWTF routes by plan, not by measured speed."""

    def failed(self, mb: Microbatch, relay: str, stage: int) -> None:
        """Nothing to ban: the simulation's known-dead set already steers choices away."""
