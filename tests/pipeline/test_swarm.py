"""SWARM's routing: throughput-weighted wiring, bans, rebalancing, and what the simulator makes of
its stateless hops, through the trainer or server to server."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest

from seedflood.pipeline.churn import ChurnSchedule, Crash
from seedflood.pipeline.costs import DataHolder, NoRelayLeft, Relay, Scenario, link
from seedflood.pipeline.records import Microbatch
from seedflood.pipeline.routers import simulate
from seedflood.pipeline.routing import GwtfRouter
from seedflood.pipeline.swarm import (
    StageBalancer,
    SwarmDirectRouter,
    ThroughputEma,
    admitted_microbatches,
    rebalance,
)


def everyone(name: str) -> bool:
    return True


def test_ema_is_bias_corrected_and_follows_the_samples() -> None:
    ema = ThroughputEma()
    assert ema.estimate is None
    ema.update(4.0)
    assert ema.estimate == pytest.approx(4.0)
    for _ in range(200):
        ema.update(1.0)
    assert ema.estimate == pytest.approx(1.0, abs=1e-6)


def test_requests_spread_in_proportion_to_measured_throughput() -> None:
    balancer = StageBalancer(["fast", "slow"], random.Random(0))
    balancer.observe("fast", 1.0, 0.5)  # 2 tasks/s
    balancer.observe("slow", 1.0, 1.0)  # 1 task/s
    picks = Counter(balancer.choose(1.0, everyone, 0) for _ in range(300))
    assert abs(picks["fast"] - 200) <= 1 and abs(picks["slow"] - 100) <= 1


def test_newcomers_are_probed_and_banned_servers_skipped() -> None:
    balancer = StageBalancer(["a", "b"], random.Random(0))
    for _ in range(10):
        balancer.choose(1.0, everyone, 0)
    balancer.sync(["a", "b", "new"])
    assert "new" in {balancer.choose(1.0, everyone, 0) for _ in range(2)}
    balancer.ban("a")
    assert "a" not in {balancer.choose(1.0, everyone, 0) for _ in range(20)}
    assert "b" not in {balancer.choose(1.0, lambda name: name != "b", 0) for _ in range(20)}


def relays(*specs: tuple[str, int, float, int]) -> tuple[Relay, ...]:
    return tuple(
        Relay(name, stage, compute, capacity, "germany") for name, stage, compute, capacity in specs
    )


def test_rebalance_moves_a_relay_to_the_bottleneck_only_when_it_helps() -> None:
    holders = (DataHolder("d0", "germany", 4),)
    lopsided = Scenario(
        2,
        relays(("a", 0, 1.0, 2), ("b", 0, 1.0, 2), ("c", 0, 1.0, 2), ("d", 1, 2.0, 2)),
        holders,
        0,
    )
    moved = rebalance(lopsided)
    assert moved is not None
    assert [r.name for r in moved.stage(1)] == ["a", "d"]
    balanced = Scenario(2, relays(("a", 0, 1.0, 2), ("b", 1, 1.0, 2)), holders, 0)
    assert rebalance(balanced) is None  # a lone relay never leaves its stage
    # Moving either fast relay would lift throughput but shrink stage 0's capacity below the
    # smallest stage capacity, so the batch per iteration would fall: no move.
    tight = Scenario(2, relays(("a", 0, 1.0, 1), ("b", 0, 1.0, 1), ("c", 1, 4.0, 2)), holders, 0)
    assert rebalance(tight) is None


def test_admission_takes_the_smallest_stage_capacity_round_robin() -> None:
    scenario = Scenario(
        2,
        relays(("a", 0, 1.0, 3), ("b", 1, 1.0, 5)),
        (DataHolder("d0", "germany", 3), DataHolder("d1", "germany", 1)),
        0,
    )
    assert admitted_microbatches(scenario) == ["d0", "d1", "d0"]


@pytest.mark.parametrize("router", ["swarm", "swarm-direct"])
def test_stateless_backward_recomputes_each_stage_forward_once(router: str) -> None:
    scenario = Scenario(
        3,
        relays(*((f"s{s}r{k}", s, 0.5 + 0.5 * k, 2) for s in range(3) for k in range(2))),
        (DataHolder("d0", "germany", 4),),
        1000,
    )
    result = simulate(scenario, router=router, microbatches_target=8, stage_parameter_bytes=0)
    trained = [m for record in result.iterations for m in record.trained]
    speed = {r.name: r.compute_s for r in scenario.relays}
    assert result.compute.recomputed_s == pytest.approx(
        sum(speed[name] for m in trained for name in m.path)
    )
    assert result.compute.discarded_s == 0.0


def test_gradients_on_a_crashed_server_are_lost_not_recomputed() -> None:
    # One microbatch; the stage-1 server finishes its backward at 9 + 9 hops and dies at 10,
    # before the all-reduce: its gradient is gone, so the microbatch is not trained that
    # iteration (GWTF would recompute stage 1 instead).
    scenario = Scenario(
        3,
        relays(("s0", 0, 1.0, 1), ("s1a", 1, 1.0, 1), ("s1b", 1, 1.0, 1), ("s2", 2, 1.0, 1)),
        (DataHolder("d0", "germany", 1),),
        0,
    )
    calm = simulate(scenario, router="swarm", microbatches_target=1, stage_parameter_bytes=0)
    server = calm.iterations[0].trained[0].path[1]
    result = simulate(
        scenario,
        router="swarm",
        churn=ChurnSchedule((Crash(10.0, server),)),
        microbatches_target=1,
        stage_parameter_bytes=0,
    )
    first, second = result.iterations
    assert first.lost == (("d0", 0),) and first.trained == ()
    assert second.trained[0].path[1] != server
    # discarded: the lost 3 s gradient and the 9 s of forwards and other stages' backwards
    # spent on the microbatch that was then not trained
    assert result.compute.discarded_s == pytest.approx(12.0)


def test_without_the_hub_activations_skip_the_trainers_slow_links() -> None:
    # One microbatch from Australia through a Belgian and a German server. Through the hub every
    # stage input crosses Australia-Europe twice (there and back, a backward's 2 tensors at
    # once); server to server only stage 0's input and its backward's inputs do.
    size = 1_000_000
    scenario = Scenario(
        2,
        (Relay("a", 0, 1.0, 1, "belgium"), Relay("b", 1, 1.0, 1, "germany")),
        (DataHolder("d0", "australia", 1),),
        size,
    )

    def hop(x: str, y: str, n: int = size) -> float:
        latency, bandwidth = link(x, y)
        return latency + n / bandwidth

    times = {
        router: simulate(
            scenario, router=router, microbatches_target=1, stage_parameter_bytes=0
        ).total_time_s
        for router in ("swarm", "swarm-direct")
    }
    far_a, far_b, near = (
        hop("australia", "belgium"),
        hop("australia", "germany"),
        hop("belgium", "germany"),
    )
    hub = 2 * far_a + 1 + 2 * far_b + 1 + hop("australia", "germany", 2 * size) + 3 + far_b
    hub += hop("australia", "belgium", 2 * size) + 3 + hop("australia", "belgium", 0)
    direct = far_a + 1 + near + 1 + near + 3 + max(far_a, near) + 3
    assert times == pytest.approx({"swarm": hub, "swarm-direct": direct})
    assert times == pytest.approx({"swarm": 9.883, "swarm-direct": 8.474}, abs=1e-3)


def test_without_the_hub_a_crashed_sender_costs_a_timeout_and_a_stage_forward() -> None:
    # The stage-0 server that ran the forward dies at 1.5 s while keeping its output for
    # stage 1's stateless backward: after the 20 s timeout the trainer bans it, stage 0's
    # forward runs again on the other server, and the microbatch is still trained. Through
    # the hub the trainer kept that input itself, and the crash costs nothing.
    scenario = Scenario(
        2,
        relays(("a0", 0, 1.0, 1), ("a1", 0, 1.0, 1), ("b", 1, 1.0, 1)),
        (DataHolder("d0", "germany", 1),),
        0,
    )
    first = SwarmDirectRouter(scenario, rebalance_every=0, seed=0).balancers["d0"][0]
    sender = first.choose(1.0, everyone, 0)
    other = ({"a0", "a1"} - {sender}).pop()
    crash = ChurnSchedule((Crash(1.5, sender),))
    runs = {
        router: simulate(
            scenario, router=router, churn=crash, microbatches_target=1, stage_parameter_bytes=0
        )
        for router in ("swarm", "swarm-direct")
    }
    direct = runs["swarm-direct"]
    (record,) = direct.iterations
    assert record.lost == () and record.trained[0].path == (other, "b")
    # 2.002: stage 1's forward is done; + 20 s timeout; stage 0 again (1 ms hops, 1 s), stage 1's
    # backward (3 s), stage 0's (3 s).
    assert direct.total_time_s == pytest.approx(2.002 + 20 + 0.001 + 1 + 0.001 + 3 + 0.001 + 3)
    assert direct.compute.discarded_s == pytest.approx(1.0)
    assert direct.compute.recomputed_s == pytest.approx(3.0)
    assert runs["swarm"].total_time_s == pytest.approx(8.008)


def test_rebalancing_happens_in_the_simulation() -> None:
    scenario = Scenario(
        2,
        relays(("a", 0, 0.5, 2), ("b", 0, 0.5, 2), ("c", 0, 0.5, 2), ("d", 1, 2.0, 4)),
        (DataHolder("d0", "germany", 4),),
        0,
    )
    result = simulate(
        scenario,
        router="swarm",
        microbatches_target=12,
        rebalance_every=1,
        stage_parameter_bytes=0,
    )
    moves = [e for record in result.iterations for e in record.events if e["type"] == "rebalance"]
    assert moves == [{"type": "rebalance", "relay": "a", "from_stage": 0, "to_stage": 1}]
    later = {m.path[1] for m in result.iterations[-1].trained}
    assert "a" in later
    assert result.iterations[-1].compute_end_s - result.iterations[-1].start_s < (
        result.iterations[0].compute_end_s - result.iterations[0].start_s
    )


def test_a_stage_without_a_usable_relay_is_named_by_both_routers() -> None:
    """The churn model keeps a relay per stage; where a schedule breaks that, GWTF and SWARM
    both say which stage ran dry instead of failing inside a min()."""
    with pytest.raises(NoRelayLeft, match="stage 2 has no usable relay left"):
        StageBalancer(["a"], random.Random(0)).choose(1.0, lambda name: False, 2)
    scenario = SimpleNamespace(stage=lambda stage: relays(("r1", 1, 1.0, 2), ("r2", 1, 1.0, 2)))
    view = SimpleNamespace(scenario=scenario, usable=lambda name: False, known_dead=set())
    mb = Microbatch("h", 0, [None, None, None], [None] * 3, [None] * 3)
    with pytest.raises(NoRelayLeft, match="stage 1 has no usable relay left") as raised:
        GwtfRouter(plan=lambda scenario: []).choose(mb, 1, True, view)  # type: ignore[arg-type]
    assert raised.value.stage == 1
