"""GWTF scenarios: the link table, the edge cost formula, YAML round trips and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedflood.pipeline.costs import (
    REGIONS,
    DataHolder,
    Relay,
    Scenario,
    ScenarioError,
    activation_bytes,
    link,
    random_scenario,
)


def test_the_link_table_covers_every_pair_of_at_least_ten_regions_symmetrically() -> None:
    assert len(REGIONS) >= 10
    for a in REGIONS:
        for b in REGIONS:
            assert link(a, b) == link(b, a)
    assert link("belgium", "belgium") == (1e-3, 2 * 2**30)
    assert link("japan", "taiwan") == (0.0192, 628e6 / 8)
    with pytest.raises(ScenarioError, match="unknown region 'mars'"):
        link("mars", "japan")


def test_edge_cost_is_half_compute_plus_latency_plus_transfer() -> None:
    size = activation_bytes(2, 128, 64)
    assert size == 2 * 128 * 64 * 4
    scenario = Scenario(
        2,
        (Relay("a", 0, 0.3, 2, "japan"), Relay("b", 1, 0.5, 2, "taiwan")),
        (DataHolder("d", "japan", 4),),
        size,
    )
    latency, bandwidth = link("japan", "taiwan")
    assert scenario.edge_cost("a", "b") == pytest.approx(0.4 + latency + size / bandwidth)
    assert scenario.edge_cost("d", "a") == pytest.approx(0.15 + 1e-3 + size / 2**31)
    assert scenario.path_cost(("d", "a", "b")) == pytest.approx(
        scenario.edge_cost("d", "a") + scenario.edge_cost("a", "b")
    )
    with pytest.raises(ScenarioError, match="no relay serves stage 0"):
        scenario.without("a")


def test_scenarios_round_trip_through_yaml_and_random_ones_are_seeded(tmp_path: Path) -> None:
    scenario = random_scenario(3, stages=3, relays_per_stage=2, holders=2)
    scenario.save(tmp_path / "s.yaml")
    assert Scenario.load(tmp_path / "s.yaml") == scenario
    assert random_scenario(3, stages=3, relays_per_stage=2, holders=2) == scenario
    assert random_scenario(4, stages=3, relays_per_stage=2, holders=2) != scenario
    assert {r.region for r in random_scenario(0, regions=2).relays} <= set(REGIONS[:2])
    homogeneous = random_scenario(0, heterogeneous=False)
    assert {(r.compute_s, r.capacity) for r in homogeneous.relays} == {(0.5, 2)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": 3}, "no relay serves stage 1"),
        (
            {
                "relays": [
                    {"name": "a", "stage": 0, "compute_s": 0, "capacity": 1, "region": "japan"}
                ]
            },
            "needs compute_s > 0",
        ),
        (
            {
                "relays": [
                    {"name": "a", "stage": 5, "compute_s": 1, "capacity": 1, "region": "japan"}
                ]
            },
            "serves stage 5; stages are 0..0",
        ),
        ({"holders": []}, "at least one data holder"),
        (
            {"holders": [{"name": "d", "region": "atlantis", "microbatches": 1}]},
            "unknown region 'atlantis'",
        ),
        (
            {
                "relays": [
                    {"name": "d", "stage": 0, "compute_s": 1, "capacity": 1, "region": "japan"}
                ]
            },
            "two nodes are named 'd'",
        ),
        ({"relays": [{"name": "a", "stage": 0}]}, "bad relay or holder entry"),
    ],
)
def test_bad_scenarios_are_refused_by_name(change: dict, message: str) -> None:
    data = {
        "stages": 1,
        "activation_bytes": 100,
        "holders": [{"name": "d", "region": "japan", "microbatches": 2}],
        "relays": [{"name": "a", "stage": 0, "compute_s": 1.0, "capacity": 1, "region": "japan"}],
        **change,
    }
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(data)
