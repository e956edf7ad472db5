"""GWTF scenarios: the link table, the edge cost formula, YAML round trips and clear refusals."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from seedflood.pipeline.costs import (
    MEAN_BANDWIDTH,
    MEAN_LATENCY_S,
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


def test_the_default_link_spread_leaves_seeded_scenarios_and_links_as_they_were() -> None:
    # The fingerprint of seeds 0-4 before link_spread existed (commit d0da703).
    scenarios = [random_scenario(seed).to_dict() for seed in range(5)]
    fingerprint = hashlib.sha256(json.dumps(scenarios, sort_keys=True).encode()).hexdigest()
    assert fingerprint[:16] == "c3d67751fe31de8a"
    scenario = random_scenario(0)
    assert scenario == random_scenario(0, link_spread=1.0)
    assert all(scenario.link(a, b) == link(a, b) for a in REGIONS for b in REGIONS)


def test_link_spread_stretches_inter_region_links_around_their_geometric_mean(
    tmp_path: Path,
) -> None:
    alike, stretched = random_scenario(3, link_spread=0.0), random_scenario(3, link_spread=2.0)
    assert alike.relays == stretched.relays == random_scenario(3).relays
    pairs = [(a, b) for a in REGIONS for b in REGIONS if a != b]
    assert {alike.link(a, b) for a, b in pairs} == {(MEAN_LATENCY_S, MEAN_BANDWIDTH)}
    assert alike.link("japan", "japan") == stretched.link("japan", "japan") == (1e-3, 2 * 2**30)
    latency, bandwidth = link("australia", "london")  # 132 ms, 77 Mbit/s: slower than most
    assert stretched.link("australia", "london") == pytest.approx(
        (latency**2 / MEAN_LATENCY_S, bandwidth**2 / MEAN_BANDWIDTH)
    )
    assert stretched.link("australia", "london")[1] == pytest.approx(3.65e6, rel=1e-3)
    rejoined = stretched.without("s0r0").with_relay(stretched.relays[0])
    assert rejoined.link_spread == 2.0 and set(rejoined.relays) == set(stretched.relays)
    stretched.save(tmp_path / "s.yaml")
    assert Scenario.load(tmp_path / "s.yaml") == stretched
    assert "link_spread" not in random_scenario(3).to_dict()
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ScenarioError, match="link_spread must be a number >= 0"):
            random_scenario(0, link_spread=bad)


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
