"""GWTF routing: the centralized min-cost reference against brute force, and the decentralized
algorithm against that reference on seeded scenarios, after a crash and after a join."""

from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from seedflood.pipeline.costs import DataHolder, Relay, Scenario, random_scenario
from seedflood.pipeline.flow import FlowSolution, optimal_flow, validate
from seedflood.pipeline.gwtf.algorithm import (
    STALE_TICKS,
    DecentralizedFlow,
    Kind,
    Message,
    decentralized_flow,
)

# networkx solves on costs rounded to microseconds, and a path has a handful of edges.
ROUNDING = 1e-5


def routings(scenario: Scenario, size: int) -> Iterator[tuple[float, float]]:
    """(total cost, maximum path cost) of every feasible multiset of ``size`` paths."""
    stages = [[r.name for r in scenario.stage(k)] for k in range(scenario.stages)]
    paths = [(h.name, *relays) for h in scenario.holders for relays in itertools.product(*stages)]
    cost = {path: scenario.path_cost(path) for path in paths}
    limit = {
        name: node.capacity if isinstance(node, Relay) else node.microbatches
        for name, node in scenario.nodes.items()
    }
    for combo in itertools.combinations_with_replacement(paths, size):
        load = Counter(name for path in combo for name in path)
        if all(count <= limit[name] for name, count in load.items()):
            yield sum(cost[p] for p in combo), max(cost[p] for p in combo)


def brute_force_value(scenario: Scenario) -> int:
    supply = sum(h.microbatches for h in scenario.holders)
    return next(size for size in range(supply, 0, -1) if any(routings(scenario, size)))


SMALL = [
    random_scenario(
        seed,
        stages=2,
        relays_per_stage=2 + (seed // 2) % 2,
        holders=1 + seed % 2,
        microbatches=4 // (1 + seed % 2),
        regions=10,
    )
    for seed in range(16)
]


@pytest.mark.parametrize("scenario", SMALL)
def test_optimal_flow_matches_brute_force(scenario: Scenario) -> None:
    value = brute_force_value(scenario)
    solution = optimal_flow(scenario)
    validate(scenario, solution)
    assert solution.value == value
    assert solution.total_cost == pytest.approx(min(routings(scenario, value))[0], abs=ROUNDING)


@pytest.mark.parametrize("scenario", SMALL)
def test_optimal_flow_has_the_lowest_maximum_of_routings_as_cheap(scenario: Scenario) -> None:
    solution = optimal_flow(scenario)
    lowest = min(
        longest
        for total, longest in routings(scenario, solution.value)
        if total <= solution.total_cost + 1e-9
    )
    assert solution.max_path_cost == pytest.approx(lowest, abs=1e-12)


def test_optimal_flow_breaks_cost_ties_toward_the_lower_maximum() -> None:
    """Two holders, two relays of capacity 1 in stage 0, both in the holders' region: the total
    is the same either way, so the reference must pair the slow relay with the near holder."""
    scenario = Scenario(
        stages=1,
        relays=(Relay("fast", 0, 0.5, 1, "japan"), Relay("slow", 0, 2.5, 1, "japan")),
        holders=(DataHolder("near", "japan", 1), DataHolder("far", "taiwan", 1)),
        activation_bytes=0,
    )
    solution = optimal_flow(scenario)
    assert set(solution.paths) == {("near", "slow"), ("far", "fast")}
    assert solution.max_path_cost == pytest.approx(2.5 / 2 + 0.001)


def test_flow_solution_times() -> None:
    scenario = Scenario(
        stages=2,
        relays=(Relay("a", 0, 1.0, 2, "japan"), Relay("b", 1, 3.0, 2, "japan")),
        holders=(DataHolder("d", "japan", 2),),
        activation_bytes=0,
    )
    solution = FlowSolution.of(scenario, [("d", "a", "b")] * 2, seconds=1.5)
    # d->a: (0 + 1)/2 + 1 ms; a->b: (1 + 3)/2 + 1 ms.
    assert solution.max_path_cost == pytest.approx(2.502)
    assert solution.total_cost == pytest.approx(5.004)
    assert solution.iteration_time() == pytest.approx(5.004)
    assert solution.iteration_time(aggregation_s=1.0) == pytest.approx(6.004)
    assert solution.cost_per_microbatch(aggregation_s=1.0) == pytest.approx(3.002)
    assert FlowSolution.of(scenario, []).cost_per_microbatch() == float("inf")


VALIDATION = Scenario(
    stages=2,
    relays=(
        Relay("a0", 0, 1.0, 1, "japan"),
        Relay("b0", 0, 1.0, 1, "japan"),
        Relay("a1", 1, 1.0, 2, "japan"),
    ),
    holders=(DataHolder("d", "japan", 2), DataHolder("e", "japan", 1)),
    activation_bytes=0,
)


@pytest.mark.parametrize(
    ("paths", "problem"),
    [
        ([("d", "a1")], "names 1 relay(s) for 2 stages; each stage needs exactly one relay"),
        ([("d", "a1", "a0")], "uses relay 'a1' for stage 0; it serves stage 1"),
        ([("a0", "b0", "a1")], "starts at 'a0', which is not a data holder"),
        ([("d", "a0", "zz")], "visits 'zz', which is not a relay"),
        ([("d", "a0", "a1"), ("d", "a0", "a1")], "'a0' carries 2 microbatches; its capacity is 1"),
        ([("e", "a0", "a1"), ("e", "b0", "a1")], "'e' carries 2 microbatches; its supply is 1"),
    ],
)
def test_validate_names_the_problem(paths: list[tuple[str, ...]], problem: str) -> None:
    costs = tuple(
        VALIDATION.path_cost(p) if all(n in VALIDATION.nodes for n in p) else 0.0 for p in paths
    )
    with pytest.raises(ValueError, match=re.escape(problem)):
        validate(VALIDATION, FlowSolution(tuple(paths), costs))


def test_validate_rejects_a_solution_of_another_scenario() -> None:
    solution = optimal_flow(VALIDATION)
    slower = replace(VALIDATION, relays=(*VALIDATION.relays[:2], Relay("a1", 1, 9.0, 2, "japan")))
    with pytest.raises(ValueError, match="is said to cost"):
        validate(slower, solution)


def test_request_with_a_stale_quote_is_rejected_with_the_true_cost() -> None:
    flow = DecentralizedFlow(VALIDATION, seed=0)
    relay = flow.nodes["a0"]
    relay.advertised["a1"] = 0.0  # a1 is the last stage: it ends paths for free
    true_cost = VALIDATION.edge_cost("a0", "a1")
    relay.receive(Message(Kind.REQUEST, "d", "a0", link="x", cost=0.5, quote=true_cost + 1))
    [reply] = flow.mailbox.collect()
    assert (reply.kind, reply.receiver, reply.cost) == (Kind.REJECT, "d", true_cost)
    assert "x" not in relay.inflows
    relay.receive(Message(Kind.REQUEST, "d", "a0", link="y", cost=0.5, quote=true_cost))
    [reply] = flow.mailbox.collect()
    assert (reply.kind, reply.cost) == (Kind.ACCEPT, true_cost)
    assert relay.inflows["y"].prefix == 0.5
    assert relay.cost_to_end() == float("inf")  # capacity 1 is taken


def test_an_inflow_that_cannot_go_on_is_pushed_back_after_k_ticks() -> None:
    flow = DecentralizedFlow(VALIDATION, seed=0)
    relay = flow.nodes["a0"]
    relay.advertised["a1"] = 0.0
    quote = relay.cost_to_end()
    relay.receive(Message(Kind.REQUEST, "d", "a0", link="y", cost=0.5, quote=quote))
    assert [m.kind for m in flow.mailbox.collect()] == [Kind.ACCEPT]
    relay.advertised["a1"] = float("inf")  # nothing downstream has room
    kinds_per_tick = []
    for tick in range(1, STALE_TICKS + 2):
        relay.act(tick)
        kinds_per_tick.append([m.kind for m in flow.mailbox.collect() if m.kind is not Kind.TABLE])
    assert all(Kind.PUSH_BACK not in kinds for kinds in kinds_per_tick[:STALE_TICKS])
    assert Kind.PUSH_BACK in kinds_per_tick[STALE_TICKS]
    assert relay.inflows == {}


@dataclass(frozen=True)
class Run:
    scenario: Scenario
    reference: FlowSolution
    solution: FlowSolution
    crashed: str
    reference_after: FlowSolution
    solution_after: FlowSolution


def scenario_mix(seed: int) -> Scenario:
    return random_scenario(
        seed,
        stages=3 + seed % 2,
        relays_per_stage=3 + (seed // 2) % 2,
        holders=1 + (seed // 4) % 2,
        regions=10,
        heterogeneous=seed % 3 != 2,
    )


@pytest.fixture(scope="module")
def runs() -> list[Run]:
    """20 seeded scenarios: route, crash the busiest relay, route again."""
    results = []
    for seed in range(20):
        scenario = scenario_mix(seed)
        flow = DecentralizedFlow(scenario, seed)
        solution = flow.run()
        load = Counter(name for path in solution.paths for name in path[1:])
        crashed = max(sorted(load), key=load.__getitem__)
        flow.remove(crashed)
        after = flow.run()
        reference_after = optimal_flow(scenario.without(crashed))
        results.append(
            Run(scenario, optimal_flow(scenario), solution, crashed, reference_after, after)
        )
    return results


@pytest.mark.slow
def test_decentralized_routes_as_many_microbatches_as_the_optimum(runs: list[Run]) -> None:
    for run in runs:
        validate(run.scenario, run.solution)
        assert run.solution.value == run.reference.value


def test_decentralized_slowest_microbatch_is_near_the_reference(runs: list[Run]) -> None:
    ratios = [run.solution.max_path_cost / run.reference.max_path_cost for run in runs]
    assert max(ratios) <= 1.10
    assert statistics.median(ratios) <= 1.05


def test_decentralized_repairs_a_crash(runs: list[Run]) -> None:
    for run in runs:
        assert run.crashed in {name for path in run.solution.paths for name in path}
        assert run.crashed not in {name for path in run.solution_after.paths for name in path}
        validate(run.scenario.without(run.crashed), run.solution_after)
        assert run.solution_after.value == run.reference_after.value
        ratio = run.solution_after.max_path_cost / run.reference_after.max_path_cost
        assert ratio <= 1.10


def test_decentralized_gives_a_joiner_work() -> None:
    """Stage 1 holds only 3 microbatches; a joiner there lifts the flow to the new optimum."""
    scenario = Scenario(
        stages=3,
        relays=(
            *(Relay(f"s0r{k}", 0, 0.6, 4, region) for k, region in enumerate(("japan", "iowa"))),
            Relay("s1r0", 1, 0.6, 2, "japan"),
            Relay("s1r1", 1, 0.6, 1, "oregon"),
            *(Relay(f"s2r{k}", 2, 0.6, 4, region) for k, region in enumerate(("japan", "iowa"))),
        ),
        holders=(DataHolder("d0", "japan", 6),),
        activation_bytes=4_000_000,
    )
    flow = DecentralizedFlow(scenario, seed=3)
    assert flow.run().value == optimal_flow(scenario).value == 3
    joiner = Relay("joiner", 1, 0.6, 3, "japan")
    flow.add(joiner)
    after = flow.run()
    grown = scenario.with_relay(joiner)
    reference = optimal_flow(grown)
    validate(grown, after)
    assert after.value == reference.value == 6
    assert sum(path.count("joiner") for path in after.paths) == 3
    assert after.max_path_cost <= 1.10 * reference.max_path_cost


def test_same_seed_same_routing() -> None:
    scenario = scenario_mix(5)
    first, second = DecentralizedFlow(scenario, seed=11), DecentralizedFlow(scenario, seed=11)
    assert first.run() == second.run()
    assert first.messages_sent == second.messages_sent > 0
    assert decentralized_flow(scenario, seed=11) == DecentralizedFlow(scenario, seed=11).run()
    other = DecentralizedFlow(scenario, seed=12)
    other.run()
    assert other.messages_sent != first.messages_sent


def test_remove_names_unknown_nodes() -> None:
    with pytest.raises(ValueError, match="no node named 'ghost'"):
        DecentralizedFlow(scenario_mix(0), seed=0).remove("ghost")


def test_a_relay_that_leaves_and_comes_back_under_its_name_is_routed_again() -> None:
    scenario = scenario_mix(2)
    flow = DecentralizedFlow(scenario, seed=5)
    optimum = flow.run().value
    busiest = Counter(r for path in flow.solution().paths for r in path[1:]).most_common(1)[0][0]
    relay = scenario.nodes[busiest]
    flow.remove(busiest)
    flow.run()
    flow.add(relay)
    again = flow.run()
    validate(scenario, again)
    assert again.value == optimum == optimal_flow(scenario).value


def test_a_flow_cut_short_by_its_tick_limit_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Settled runs are marked so; a run stopped at max_ticks before its flows went quiet is
    marked unsettled and warns, instead of passing a possibly smaller routing off as done."""
    scenario = scenario_mix(5)
    assert DecentralizedFlow(scenario, seed=11).run().settled
    with caplog.at_level("WARNING"):
        cut = DecentralizedFlow(scenario, seed=11).run(max_ticks=3)
    assert not cut.settled
    assert "stopped at its 3-tick limit before it settled" in caplog.text
