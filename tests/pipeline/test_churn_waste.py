"""Where churn's wasted compute comes from (ledger.py's causes, which must add up to the totals),
and GWTF's incremental flow repair against a full replan (routing.DecentralizedPlanner)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from seedflood.pipeline.churn import ChurnRates, ChurnSchedule, Crash, Join
from seedflood.pipeline.costs import (
    SAME_REGION_LATENCY_S,
    DataHolder,
    Relay,
    Scenario,
    random_scenario,
)
from seedflood.pipeline.flow import optimal_flow
from seedflood.pipeline.gwtf.algorithm import DecentralizedFlow, decentralized_flow
from seedflood.pipeline.ledger import DISCARDED, RECOMPUTED
from seedflood.pipeline.records import ComputeAccount, SimResult
from seedflood.pipeline.routers import simulate
from seedflood.pipeline.routing import DecentralizedPlanner

HOP = SAME_REGION_LATENCY_S
TIMEOUT = 5.0
# One microbatch through three one-second stages in one region; stage 1 has a spare relay.
LINE = Scenario(
    3,
    (
        Relay("s0", 0, 1.0, 1, "germany"),
        Relay("s1a", 1, 1.0, 1, "germany"),
        Relay("s1b", 1, 1.0, 1, "germany"),
        Relay("s2", 2, 1.0, 1, "germany"),
    ),
    (DataHolder("d0", "germany", 1),),
    0,
)


def run_line(router: str, events: tuple[Crash, ...] = ()) -> SimResult:
    return simulate(
        LINE,
        router=router,
        plan=lambda scenario: [("d0", "s0", "s1a", "s2")],
        churn=ChurnSchedule(events),
        microbatches_target=1,
        stage_parameter_bytes=0,
        forward_timeout_s=TIMEOUT,
        backward_timeout_s=TIMEOUT,
        seed=0,
    )


def assert_causes_add_up(compute: ComputeAccount) -> None:
    assert math.isclose(
        sum(compute.waste[c] for c in RECOMPUTED), compute.recomputed_s, abs_tol=1e-9
    )
    assert math.isclose(sum(compute.waste[c] for c in DISCARDED), compute.discarded_s, abs_tol=1e-9)
    assert math.isclose(compute.accounted_s, compute.live_relay_s, rel_tol=1e-9)


def test_gwtf_crash_mid_backward_wastes_one_stage_by_cause() -> None:
    # s1a's backward runs over [5 + 4·HOP, 7 + 4·HOP] and dies at 6: its forward (1 s, a kept
    # product) and the second of backward in progress are discarded, and s1b recomputes stage 1
    # alone (forward 1 s + backward 2 s); no other stage runs again.
    compute = run_line("gwtf", (Crash(6.0, "s1a"),)).compute
    assert compute.waste == pytest.approx(
        {
            "re-forward": 0.0,
            "recovery": 3.0,
            "crashed task": 6 - (5 + 4 * HOP),
            "crashed products": 1.0,
            "dropped microbatch": 0.0,
        }
    )
    assert compute.useful_s == pytest.approx(1 + 3 + 2)  # s0 forward, s2, s0 backward
    assert_causes_add_up(compute)


def test_swarm_work_on_a_dropped_microbatch_is_discarded_not_useful() -> None:
    # SWARM: every stage forwards (1 s) from the trainer, and each stateless backward re-runs the
    # forward (1 s) before the backward (2 s). The stage-1 server finishes its backward at
    # 9 + 9·HOP and dies at 10, before the all-reduce, holding the microbatch's gradient: the
    # microbatch is out of the average, so none of the 12 s spent on it trained anything. It is
    # trained again in the second iteration (9 s useful, 3 s stateless re-forward).
    calm = run_line("swarm")
    assert calm.compute.useful_s == pytest.approx(9.0) and calm.compute.discarded_s == 0.0
    assert calm.compute.waste["re-forward"] == pytest.approx(3.0)
    server = calm.iterations[0].trained[0].path[1]
    result = run_line("swarm", (Crash(10.0, server),))
    assert result.iterations[0].lost == (("d0", 0),)
    compute = result.compute
    assert compute.waste == pytest.approx(
        {
            "re-forward": 3.0,
            "recovery": 0.0,
            "crashed task": 0.0,
            "crashed products": 3.0,
            "dropped microbatch": 9.0,
        }
    )
    assert compute.useful_s == pytest.approx(9.0)
    assert_causes_add_up(compute)


@pytest.mark.parametrize("router", ["gwtf", "swarm"])
def test_waste_causes_add_up_under_ten_times_high_churn(router: str) -> None:
    scenario = random_scenario(2, stages=3, relays_per_stage=3, holders=2, microbatches=3)
    result = simulate(
        scenario,
        router=router,
        plan=lambda s: optimal_flow(s).paths,
        churn=ChurnRates(crash_per_relay_hour=30.0, join_per_relay_hour=30.0),
        microbatches_target=40,
        seed=3,
    )
    compute = result.compute
    assert_causes_add_up(compute)
    assert compute.waste["crashed products"] > 0
    lost = sum(len(record.lost) for record in result.iterations)
    if router == "gwtf":  # recovers every lost product, never re-forwards by design
        assert lost == 0
        assert compute.waste["dropped microbatch"] == compute.waste["re-forward"] == 0.0
    else:  # drops what dies with a server, recomputes only a backward cut short
        assert lost > 0 and compute.waste["dropped microbatch"] > 0


@pytest.mark.parametrize("seed", [0, 4])
def test_repair_after_a_crash_routes_as_many_microbatches_as_a_replan(seed: int) -> None:
    # Seed 0 routes 4 microbatches before and after the crash of its busiest relay (s0r1), seed
    # 4 routes 5 before and after s2r1's; the repaired flow keeps the nodes it had.
    scenario = random_scenario(seed, stages=3, relays_per_stage=3, holders=2, microbatches=3)
    repairing, replanning = DecentralizedPlanner(seed), DecentralizedPlanner(seed, repair=False)
    first = repairing(scenario)
    assert first == list(decentralized_flow(scenario, seed).paths)
    flow = repairing.flow
    busiest = Counter(name for path in first for name in path[1:]).most_common(1)[0][0]
    after = scenario.without(busiest)
    repaired, replanned = repairing(after), replanning(after)
    assert repairing.flow is flow and busiest not in flow.nodes
    assert len(repaired) == len(replanned) == optimal_flow(after).value
    assert repairing.last is not None and repairing.last.settled
    assert all(busiest not in path for path in repaired)


def test_the_simulation_repairs_its_flow_through_crashes_and_joins() -> None:
    """GWTF's router plans each iteration on the flow it kept: the crashed relay is removed from
    it and the joiner added, never a new DecentralizedFlow; every microbatch still trains once."""
    scenario = random_scenario(1, stages=3, relays_per_stage=3, holders=2, microbatches=3)
    flows: list[DecentralizedFlow] = []

    class Recording(DecentralizedPlanner):
        def __call__(self, scenario: Scenario) -> list[tuple[str, ...]]:
            paths = super().__call__(scenario)
            assert self.flow is not None
            flows.append(self.flow)
            return paths

    events = (Crash(2.0, "s1r0"), Join(3.0, "j0", 0.5, 2, "germany"))
    result = simulate(
        scenario,
        router="gwtf",
        plan=Recording(1),
        churn=ChurnSchedule(events),
        microbatches_target=20,
        stage_parameter_bytes=10**6,
        forward_timeout_s=TIMEOUT,
        backward_timeout_s=TIMEOUT,
    )
    assert len(flows) >= 2 and all(flow is flows[0] for flow in flows)
    assert "s1r0" not in flows[0].nodes and "j0" in flows[0].nodes
    for record in result.iterations:
        assert not record.lost and record.duplicate_gradients == 0
    assert any("j0" in m.path for m in result.iterations[-1].trained)


def test_repair_survives_a_stage_whose_every_relay_was_replaced() -> None:
    """Between two plans stage 0 lost both its relays and gained a joiner: adding before
    removing keeps the flow's scenario valid (removing first would leave stage 0 empty)."""
    scenario = random_scenario(0, stages=2, relays_per_stage=2, holders=1, microbatches=2)
    planner = DecentralizedPlanner(0)
    planner(scenario)
    joiner = Relay("j0", 0, 0.5, 2, "germany")
    kept = tuple(relay for relay in scenario.relays if relay.stage == 1)
    replaced = replace(scenario, relays=(*kept, joiner))
    paths = planner(replaced)
    assert planner.flow is not None and set(planner.flow.nodes) >= {"j0"}
    assert len(paths) == optimal_flow(replaced).value and all(p[1] == "j0" for p in paths)
