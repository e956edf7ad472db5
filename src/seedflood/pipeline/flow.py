"""Routing microbatches through the pipeline: the flow solution and the centralized reference.

A microbatch travels ``(holder, relay of stage 0, ..., relay of stage S-1)``; the last relay
computes the loss, so there is no return edge. A relay carries at most ``capacity`` microbatches
per iteration and a holder supplies ``microbatches``. The objective is lexicographic: route as
many microbatches as possible, then make the slowest one (the maximum path cost) fast, since it
bounds the iteration. The decentralized algorithm that GWTF runs lives in ``gwtf/algorithm.py``
and is measured against ``optimal_flow`` here.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from seedflood.pipeline.costs import DataHolder, Relay, Scenario

MICROSECONDS = 1_000_000
IMPROVEMENT = 1e-9


@dataclass(frozen=True)
class FlowSolution:
    """One routed microbatch per path; ``costs`` are the matching path costs in seconds."""

    paths: tuple[tuple[str, ...], ...]
    costs: tuple[float, ...]
    seconds: float = field(default=0.0, compare=False)
    # False where an iterative solver stopped at its step limit before it settled: the routing
    # may carry fewer microbatches, or costlier ones, than the solver would reach
    settled: bool = field(default=True, compare=False)

    @classmethod
    def of(
        cls, scenario: Scenario, paths: Iterable[tuple[str, ...]], seconds: float = 0.0
    ) -> FlowSolution:
        """Sorted paths, so that equal routings compare equal whatever order found them."""
        ordered = tuple(sorted(tuple(path) for path in paths))
        return cls(ordered, tuple(scenario.path_cost(path) for path in ordered), seconds)

    @property
    def value(self) -> int:
        return len(self.paths)

    @property
    def max_path_cost(self) -> float:
        return max(self.costs, default=0.0)

    @property
    def total_cost(self) -> float:
        return sum(self.costs)

    def iteration_time(self, aggregation_s: float = 0.0) -> float:
        """Forward and backward both wait for the slowest microbatch, then stages aggregate."""
        return 2 * self.max_path_cost + aggregation_s

    def cost_per_microbatch(self, aggregation_s: float = 0.0) -> float:
        if not self.value:
            return math.inf
        return self.iteration_time(aggregation_s) / self.value


def validate(scenario: Scenario, solution: FlowSolution) -> None:
    """Raise ValueError naming the first path or node that breaks the routing model."""
    if len(solution.costs) != len(solution.paths):
        raise ValueError(f"{len(solution.paths)} paths but {len(solution.costs)} costs")
    load: Counter[str] = Counter()
    for path, cost in zip(solution.paths, solution.costs, strict=True):
        if len(path) != scenario.stages + 1:
            raise ValueError(
                f"path {path} names {len(path) - 1} relay(s) for {scenario.stages} stages; each "
                "stage needs exactly one relay (a stage is skipped or repeated)"
            )
        if not isinstance(scenario.nodes.get(path[0]), DataHolder):
            raise ValueError(f"path {path} starts at {path[0]!r}, which is not a data holder")
        for stage, name in enumerate(path[1:]):
            relay = scenario.nodes.get(name)
            if not isinstance(relay, Relay):
                raise ValueError(f"path {path} visits {name!r}, which is not a relay")
            if relay.stage != stage:
                raise ValueError(
                    f"path {path} uses relay {name!r} for stage {stage}; it serves stage "
                    f"{relay.stage}"
                )
        if not math.isclose(cost, scenario.path_cost(path), rel_tol=1e-9):
            raise ValueError(
                f"path {path} is said to cost {cost}; it costs {scenario.path_cost(path)}"
            )
        load.update(path)
    for name, count in load.items():
        node = scenario.nodes[name]
        limit = node.capacity if isinstance(node, Relay) else node.microbatches
        if count > limit:
            what = "capacity" if isinstance(node, Relay) else "supply"
            raise ValueError(f"{name!r} carries {count} microbatches; its {what} is {limit}")


def optimal_flow(scenario: Scenario) -> FlowSolution:
    """The centralized reference: a min-cost maximum flow, split into unit paths that are then
    rearranged to lower the maximum path cost without raising the total.

    networkx solves min-cost flow exactly only on integer weights, so edge costs are rounded to
    microseconds. The flow minimizes the total cost, not the maximum, so how it is split into
    paths, and which of several equally cheap flows is taken, matter. ``_balance`` rearranges
    pairs of paths without changing any relay's load or raising the total while that lowers the
    larger of the two costs; each step lowers the sorted cost vector, so it ends, at paths no
    single rearrangement improves: a local optimum, exact on the brute-forced small cases of the
    tests. A flow that pays more in total for a lower maximum is out of its reach, so the
    decentralized algorithm, which minimizes the maximum directly, can beat this reference.
    """
    start = time.perf_counter()
    graph = nx.DiGraph()
    for holder in scenario.holders:
        graph.add_edge("source", ("holder", holder.name), capacity=holder.microbatches, weight=0)
        for relay in scenario.stage(0):
            weight = _microseconds(scenario.edge_cost(holder.name, relay.name))
            graph.add_edge(("holder", holder.name), ("in", relay.name), weight=weight)
    for relay in scenario.relays:
        graph.add_edge(("in", relay.name), ("out", relay.name), capacity=relay.capacity, weight=0)
    for stage in range(scenario.stages - 1):
        for a, b in itertools.product(scenario.stage(stage), scenario.stage(stage + 1)):
            weight = _microseconds(scenario.edge_cost(a.name, b.name))
            graph.add_edge(("out", a.name), ("in", b.name), weight=weight)
    for relay in scenario.stage(scenario.stages - 1):
        graph.add_edge(("out", relay.name), "sink", weight=0)
    flow = nx.max_flow_min_cost(graph, "source", "sink")
    paths = _balance(scenario, _unit_paths(flow))
    return FlowSolution.of(scenario, paths, time.perf_counter() - start)


def _microseconds(seconds: float) -> int:
    return round(seconds * MICROSECONDS)


def _unit_paths(flow: dict[Any, dict[Any, int]]) -> list[list[str]]:
    """Peel one microbatch at a time off an integral source-to-sink flow."""
    left = {(a, b): amount for a, out in flow.items() for b, amount in out.items() if amount}
    paths = []
    while any(left.get(("source", holder)) for holder in flow["source"]):
        node, path = "source", []
        while node != "sink":
            step = next(b for b in flow[node] if left.get((node, b)))
            left[(node, step)] -= 1
            if step != "sink" and step[0] in ("holder", "in"):
                path.append(step[1])
            node = step
        paths.append(path)
    return paths


def _balance(scenario: Scenario, paths: list[list[str]]) -> list[tuple[str, ...]]:
    """Rearrange paths, never changing a node's load or raising the total cost, while that
    lowers the costlier of two paths: always the rearrangement that lowers it most, so the
    slowest paths are fixed first.

    Two rearrangements qualify: two paths through one relay exchange everything after it (the
    edge loads do not change), and two paths exchange their relays of one stage when that costs
    no more in total (ties are common: relays in one region cost the same to reach).
    """
    edge = functools.cache(scenario.edge_cost)
    routes = [tuple(path) for path in paths]
    reach = [_reach(edge, route) for route in routes]
    while True:
        best: tuple[float, int, int, tuple[str, ...], tuple[str, ...]] | None = None
        for p, q in itertools.combinations(range(len(routes)), 2):
            a, b = routes[p], routes[q]
            before = max(reach[p][-1], reach[q][-1])
            for i in range(1, len(a)):
                if a[i] == b[i] and i + 1 < len(a):
                    new_a, new_b = a[: i + 1] + b[i + 1 :], b[: i + 1] + a[i + 1 :]
                    cost_a = reach[p][i] + reach[q][-1] - reach[q][i]
                    cost_b = reach[q][i] + reach[p][-1] - reach[p][i]
                elif a[i] != b[i]:
                    new_a, new_b = (*a[:i], b[i], *a[i + 1 :]), (*b[:i], a[i], *b[i + 1 :])
                    cost_a = reach[p][-1] + _through(edge, a, i, b[i]) - _through(edge, a, i, a[i])
                    cost_b = reach[q][-1] + _through(edge, b, i, a[i]) - _through(edge, b, i, b[i])
                    if cost_a + cost_b > reach[p][-1] + reach[q][-1] + IMPROVEMENT:
                        continue
                else:
                    continue
                gain = before - max(cost_a, cost_b)
                if gain > IMPROVEMENT and (best is None or gain > best[0]):
                    best = (gain, p, q, new_a, new_b)
        if best is None:
            return routes
        _, p, q, routes[p], routes[q] = best
        reach[p], reach[q] = _reach(edge, routes[p]), _reach(edge, routes[q])


def _reach(edge: Callable[[str, str], float], route: tuple[str, ...]) -> list[float]:
    """Cost from the holder to each node of the route."""
    return [0.0, *itertools.accumulate(edge(a, b) for a, b in itertools.pairwise(route))]


def _through(edge: Callable[[str, str], float], route: tuple[str, ...], i: int, node: str) -> float:
    """Cost of the edges into and out of position ``i`` of ``route`` if ``node`` stood there."""
    inbound = edge(route[i - 1], node)
    return inbound + (edge(node, route[i + 1]) if i + 1 < len(route) else 0.0)
