"""GWTF's decentralized flow on deep pipelines (issue 34): at 12-16 stages it must settle within
its tick limit at the optimum's number of microbatches, near its cost, because frozen nodes move
only in their stage's window of a sweep and so weigh every move on exact costs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from seedflood.pipeline.costs import Scenario, random_scenario
from seedflood.pipeline.flow import optimal_flow, validate
from seedflood.pipeline.gwtf.algorithm import DecentralizedFlow, FlowNode
from seedflood.pipeline.gwtf.links import HOLDERS
from seedflood.pipeline.gwtf.messages import Kind, Message, SwapOffer
from seedflood.pipeline.gwtf.moves import FROZEN, MOVE_WINDOW, PROPOSE_TICKS, sweep_ticks

# Over 10 seeds of each of 12, 14, 16 stages x 3, 5, 8 relays, the decentralized flow's slowest
# path cost at most 1.019x the reference's (median 1.000x), its total at most 1.026x.
FACTOR = 1.05


def deep(seed: int, stages: int, relays: int) -> Scenario:
    """The comparison's scenario (experiment.RunSpec.scenario) at pipeline depth."""
    return random_scenario(
        seed, stages=stages, relays_per_stage=relays, holders=2, microbatches=8, regions=10
    )


def assert_settles_at_the_optimum(seed: int, stages: int, relays: int) -> None:
    scenario = deep(seed, stages, relays)
    solution = DecentralizedFlow(scenario, seed).run()
    reference = optimal_flow(scenario)
    validate(scenario, solution)
    assert solution.settled
    assert solution.value == reference.value
    assert solution.max_path_cost <= FACTOR * reference.max_path_cost
    assert solution.total_cost <= FACTOR * reference.total_cost


@pytest.mark.slow
def test_a_14_stage_pipeline_settles_at_the_optimum() -> None:
    """The shape of the run issue 34 traced, which reached the optimum only near 7,750 ticks."""
    assert_settles_at_the_optimum(seed=1, stages=14, relays=6)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "stages", "relays"), [(0, 12, 3), (6, 12, 8), (2, 14, 6), (3, 16, 5), (0, 16, 8)]
)
def test_deep_pipelines_settle_at_the_optimum(seed: int, stages: int, relays: int) -> None:
    assert_settles_at_the_optimum(seed, stages, relays)


def test_a_frozen_node_proposes_only_in_its_stage_window() -> None:
    flow = DecentralizedFlow(deep(0, stages=4, relays=2), seed=0)
    sweep = sweep_ticks(4)
    assert sweep == 5 * MOVE_WINDOW + 4
    for node in flow.nodes.values():
        assert all(node.take_turn(tick) for tick in range(sweep))  # warm: at will
        node.temperature = FROZEN * node.t0 / 2
        opens = (node.stage - HOLDERS) * MOVE_WINDOW
        turns = [tick for tick in range(sweep, 3 * sweep) if node.take_turn(tick)]
        assert turns == [
            start + opens + k for start in (sweep, 2 * sweep) for k in range(PROPOSE_TICKS)
        ]
        assert node.temperature < FROZEN * node.t0 / 2  # cooled as its windows opened


def test_a_move_that_leaves_the_larger_cost_as_it_was_is_refused() -> None:
    node = DecentralizedFlow(deep(0, stages=2, relays=2), seed=0).nodes["s0r0"]
    assert node.temperature == node.t0  # warm: a worse move could pass, a neutral one not
    assert not node.anneal(0.0)
    assert node.temperature == node.t0
    assert node.anneal(-1.0)


def test_a_swap_weighed_on_an_outdated_view_is_refused() -> None:
    scenario = deep(0, stages=3, relays=3)
    flow = DecentralizedFlow(scenario, seed=0)
    flow.run()
    stage = [n for n in flow.nodes.values() if n.stage == 1 and n.units()]
    asker, asked = stage[0], next(n for n in stage[1:] if n.units())
    theirs = asked.units()[0]
    offer = SwapOffer(asker.units()[0], replace(theirs, prefix=theirs.prefix + 1.0), 0.0)
    asked.receive(Message(Kind.PROPOSE_SWAP, asker.name, asked.name, swap=offer))
    [reply] = flow.mailbox.collect()
    assert reply.kind is Kind.REJECT_MOVE
    assert asked.units()[0] == theirs


def true_costs(flow: DecentralizedFlow, node: FlowNode, link: str) -> tuple[float, float]:
    """A unit's prefix and suffix, read off the nodes of its whole path (a view no node has)."""
    costs, here, inflow = [], node, link
    while (prev := here.inflows[inflow].prev) is not None:
        costs.append(flow.scenario.edge_cost(prev, here.name))
        here = flow.nodes[prev]
        inflow = here.outflows[inflow].inflow
        assert inflow is not None
    prefix, suffix, here, inflow = sum(costs), 0.0, node, link
    while not here.last:
        out = here.inflows[inflow].out
        assert out is not None
        after = flow.nodes[here.outflows[out].next]
        suffix += flow.scenario.edge_cost(here.name, after.name)
        here, inflow = after, out
    return prefix, suffix


@pytest.mark.slow
def test_frozen_nodes_weigh_their_moves_on_exact_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every node is frozen, whenever one looks for a move, every unit it and its
    same-stage peers hold shows its path's true prefix and suffix, though moves keep
    changing paths meanwhile."""
    stages = 12
    flow = DecentralizedFlow(deep(7, stages=stages, relays=5), seed=7)
    while any(node.temperature >= FROZEN * node.t0 for node in flow.nodes.values()):
        flow.step()
    checked = []

    def checking(node: FlowNode) -> Callable[[], None]:
        try_move = node.try_move

        def check_then_move() -> None:
            for peer in flow.nodes.values():
                if peer.stage == node.stage:
                    for view in peer.units():
                        prefix, suffix = true_costs(flow, peer, view.inflow)
                        assert view.prefix == pytest.approx(prefix, abs=1e-9)
                        assert view.suffix == pytest.approx(suffix, abs=1e-9)
                        checked.append(view)
            try_move()

        return check_then_move

    for node in flow.nodes.values():
        monkeypatch.setattr(node, "try_move", checking(node))
    changed = sum(flow.step() for _ in range(3 * sweep_ticks(stages)))
    assert len(checked) > 1000
    assert changed > 30  # ticks in which some path changed
