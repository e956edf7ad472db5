"""How simulated microbatches are routed: the interface GWTF and SWARM share, and GWTF's side.

The simulation leaves every routing decision to a ``Router``: which microbatches an iteration
admits, where a joining relay serves, which relay a stage's task goes to, and what is learnt
from replies and failures. Routers never see the simulation itself: ``choose`` reads it through a
``RoutingView`` (the live scenario, the relays known dead, which relays are usable and which have
a free slot), and the other calls get only the scenario or the microbatch at hand, so a router
depends on what it reads, not on the event loop. SWARM's router lives in swarm.py; GWTF's, which
follows an injected planner's paths once they are checked against the scenario, lives here with
the interface, and so does the planner that runs GWTF's decentralized algorithm across iterations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence, Set
from dataclasses import replace
from typing import Protocol

from seedflood.pipeline.churn import Join, bottleneck_stage
from seedflood.pipeline.costs import NoRelayLeft, Relay, Scenario, ScenarioError
from seedflood.pipeline.flow import FlowSolution
from seedflood.pipeline.gwtf.algorithm import DecentralizedFlow
from seedflood.pipeline.records import Microbatch, Task

Planner = Callable[[Scenario], Sequence[tuple[str, ...]]]


class RoutingView(Protocol):
    """All a router may read of the running simulation when it chooses a relay. Read-only, so a
    choice cannot change the simulation's state; ``usable`` says whether a relay may be sent work
    at all, ``has_free_slot`` whether it has room to keep one more microbatch's activations."""

    @property
    def scenario(self) -> Scenario: ...

    @property
    def known_dead(self) -> Set[str]: ...

    def usable(self, name: str) -> bool: ...

    def has_free_slot(self, name: str) -> bool: ...


class Router(Protocol):
    """What differs between GWTF and SWARM. ``stateful`` routers keep activations on relays
    between forward and backward; stateless ones re-run a stage's forward in its backward. A
    ``hub`` router routes every hop through the data holder; the others pass outputs relay to
    relay. ``name`` is what results are labelled with and what the router is chosen by."""

    name: str
    stateful: bool
    hub: bool

    def begin_iteration(
        self, scenario: Scenario, iteration: int
    ) -> tuple[Scenario, list[tuple[str, tuple[str | None, ...]]]]: ...

    def place(self, joiner: Join, scenario: Scenario) -> int: ...

    def choose(self, mb: Microbatch, stage: int, forward_only: bool, view: RoutingView) -> str: ...

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


class DecentralizedPlanner:
    """GWTF's decentralized algorithm as a planner, one per simulation run.

    With ``repair`` (the default) it keeps its flow nodes from one plan to the next and brings
    them to the new membership the way GWTF meets churn (gwtf.md §5.3): departed relays are
    removed, so their neighbours drop the links to them and re-request the units left without a
    hop; joiners are added; then the nodes tick until the flow settles again, starting from the
    routing they had rather than from nothing. Without ``repair`` every membership change starts
    a fresh run of the algorithm, the replan it is compared against. ``last`` is the latest
    solution (how many microbatches it routes, whether it settled)."""

    def __init__(self, seed: int, *, repair: bool = True, max_ticks: int | None = None) -> None:
        self.seed = seed
        self.repair = repair
        self.max_ticks = max_ticks
        self.flow: DecentralizedFlow | None = None
        self.last: FlowSolution | None = None

    def __call__(self, scenario: Scenario) -> list[tuple[str, ...]]:
        flow = self.flow
        if flow is None or not self.repair or not self._membership_differs_only(scenario):
            flow = self.flow = DecentralizedFlow(scenario, self.seed)
        else:
            # joiners before the departed, so that a stage whose every relay was replaced
            # between two plans is never empty in between (the flow refuses such a scenario)
            before = {relay.name: relay for relay in flow.scenario.relays}
            after = {relay.name: relay for relay in scenario.relays}
            for name, relay in after.items():
                if name not in before:
                    flow.add(relay)
                elif before[name] != relay:
                    flow.remove(name)
                    flow.add(relay)
            for name in before:
                if name not in after:
                    flow.remove(name)
        self.last = flow.run(self.max_ticks)
        return list(self.last.paths)

    def _membership_differs_only(self, scenario: Scenario) -> bool:
        """Whether ``scenario`` is the flow's own but for which relays serve: churn, which the
        nodes can repair; anything else (holders, stages, sizes) is another problem."""
        assert self.flow is not None, "a flow to compare with"
        return replace(self.flow.scenario, relays=scenario.relays) == scenario


class GwtfRouter:
    """Stateful relay-to-relay routing along a planned flow, with one-stage crash recovery."""

    name = "gwtf"
    stateful = True
    hub = False

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

    def choose(self, mb: Microbatch, stage: int, forward_only: bool, view: RoutingView) -> str:
        planned = mb.path[stage]
        if planned is not None and planned not in view.known_dead:
            return planned
        before = mb.path[stage - 1] if stage else mb.holder
        after = mb.path[stage + 1] if stage + 1 < len(mb.path) else None

        def cost(name: str) -> float:
            ends = [end for end in (before, after) if end is not None]
            return sum(view.scenario.edge_cost(end, name) for end in ends)

        candidates = [r.name for r in view.scenario.stage(stage) if view.usable(r.name)]
        if not candidates:
            raise NoRelayLeft(stage)
        return min(candidates, key=lambda name: (not view.has_free_slot(name), cost(name), name))

    def observe(self, task: Task, elapsed_s: float) -> None:
        """GWTF routes by plan, not by measured speed."""

    def failed(self, mb: Microbatch, relay: str, stage: int) -> None:
        """Nothing to ban: the simulation's known-dead set already steers choices away."""
