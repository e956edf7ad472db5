"""GWTF or SWARM (through its trainer hub, or server to server) by name, and a simulation run
with the one named: the pipeline's entry point.

The only module that knows both the event loop (simulation.py) and every concrete router
(routing.py, swarm.py), so that neither of those has to know the other: the simulation drives
any ``Router``, and routers read the simulation through a ``RoutingView`` alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from seedflood.pipeline.churn import ChurnRates, ChurnSchedule, churn_events, resolve_rates
from seedflood.pipeline.costs import Scenario, ScenarioError
from seedflood.pipeline.flow import optimal_flow
from seedflood.pipeline.records import SimResult
from seedflood.pipeline.routing import GwtfRouter, Planner, Router
from seedflood.pipeline.simulation import Simulation
from seedflood.pipeline.swarm import SwarmDirectRouter, SwarmRouter

SWARM_ROUTERS = {router.name: router for router in (SwarmRouter, SwarmDirectRouter)}
ROUTERS = (GwtfRouter.name, *SWARM_ROUTERS)
# fp32 gradients of SmolLM2-135M (134,515,008 parameters), the project's default model, split
# evenly over the stages when no stage size is given.
DEFAULT_MODEL_GRADIENT_BYTES = 134_515_008 * 4


def optimal_plan(scenario: Scenario) -> Sequence[tuple[str, ...]]:
    """The centralized optimal flow's paths: GWTF's routing when no planner is injected."""
    return optimal_flow(scenario).paths


def make_router(
    name: str,
    scenario: Scenario,
    *,
    plan: Planner | None = None,
    seed: int = 0,
    rebalance_every: int = 5,
) -> Router:
    """The router called ``name`` for ``scenario``. GWTF follows ``plan`` (default: the
    centralized optimal flow); either SWARM breaks ties with ``seed`` and rebalances every
    ``rebalance_every`` iterations (0: never). Each ignores the other's options, but a negative
    ``rebalance_every`` is refused for both, being a mistake whichever router is asked for."""
    if name not in ROUTERS:
        raise ScenarioError(f"router must be one of {', '.join(ROUTERS)}; got {name!r}")
    if rebalance_every < 0:
        raise ScenarioError(f"rebalance_every must be >= 0; got {rebalance_every}")
    if name == GwtfRouter.name:
        return GwtfRouter(plan or optimal_plan)
    return SWARM_ROUTERS[name](scenario, rebalance_every=rebalance_every, seed=seed)


def simulate(
    scenario: Scenario,
    *,
    router: str,
    plan: Planner | None = None,
    churn: ChurnSchedule | ChurnRates | str = "none",
    microbatches_target: int,
    seed: int = 0,
    forward_timeout_s: float = 20.0,
    backward_timeout_s: float = 20.0,
    stage_parameter_bytes: int | None = None,
    rebalance_every: int = 5,
) -> SimResult:
    """Train until ``microbatches_target`` microbatches are in the averaged gradients.

    ``router``, ``plan``, ``seed`` and ``rebalance_every`` choose the router as `make_router`
    does. ``churn`` is an explicit schedule, rates, or a preset name ("none", "low", "high")
    drawn with ``seed``. Timeouts are how long a sender waits on a silent relay (20 s as in the GWTF
    prototype). ``stage_parameter_bytes`` is what a stage's replicas average per iteration
    (default: SmolLM2-135M's fp32 gradients split over the stages).
    """
    routing = make_router(router, scenario, plan=plan, seed=seed, rebalance_every=rebalance_every)
    if microbatches_target < 1:
        raise ScenarioError(f"microbatches_target must be >= 1; got {microbatches_target}")
    if forward_timeout_s <= 0 or backward_timeout_s <= 0:
        raise ScenarioError("forward_timeout_s and backward_timeout_s must be > 0")
    events = (
        iter(churn)
        if isinstance(churn, ChurnSchedule)
        else churn_events(scenario, resolve_rates(churn), seed)
    )
    sim = Simulation(
        scenario,
        routing,
        events,
        forward_timeout_s=forward_timeout_s,
        backward_timeout_s=backward_timeout_s,
        stage_parameter_bytes=(
            DEFAULT_MODEL_GRADIENT_BYTES // scenario.stages
            if stage_parameter_bytes is None
            else stage_parameter_bytes
        ),
    )
    return sim.run(microbatches_target)
