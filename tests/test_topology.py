"""Tests for seedflood.topology: graph shapes, distances, gossip matrices and error reporting."""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.topology import (
    TOPOLOGIES,
    Topology,
    TopologyError,
    check_parameters,
    from_edges,
    grid_shape,
    make_topology,
)


@pytest.mark.parametrize(
    ("name", "n", "diameter"),
    [
        ("ring", 16, 8),
        ("ring", 17, 8),
        ("ring", 2, 1),
        ("meshgrid", 16, 6),
        ("meshgrid", 128, 22),
        ("meshgrid", 7, 6),
        ("torus", 16, 4),
        ("torus", 128, 4 + 8),
        ("complete", 16, 1),
        ("star", 16, 2),
        # ±1, ±2, ±4, 8 reach 7 of the 15 others; every other offset d is a sum of two of
        # them (3 = 4-1, 5 = 4+1, 6 = 4+2, 7 = 8-1, 9 = 8+1, 10 = 8+2, 11 = -4-1, 13 = -4+1).
        ("exponential", 16, 2),
        ("exponential", 32, 3),
    ],
)
def test_diameter(name: str, n: int, diameter: int) -> None:
    assert make_topology(name, n).diameter == diameter


def test_grid_shape_is_as_square_as_possible() -> None:
    assert grid_shape(16) == (4, 4)
    assert grid_shape(128) == (8, 16)
    assert grid_shape(12) == (3, 4)
    assert grid_shape(13) == (1, 13)


@pytest.mark.parametrize(
    ("name", "n", "m"),
    [
        ("ring", 16, 16),
        ("ring", 2, 1),
        ("meshgrid", 16, 24),
        ("torus", 16, 32),
        ("torus", 8, 12),
        ("complete", 10, 45),
        ("star", 10, 9),
        ("exponential", 16, 56),
    ],
)
def test_edge_counts(name: str, n: int, m: int) -> None:
    topo = make_topology(name, n)
    assert len(topo.edges) == m
    assert len(topo.directed_edges) == 2 * m
    assert all(i < j for i, j in topo.edges)
    assert list(topo.edges) == sorted(set(topo.edges))


def test_neighbors() -> None:
    assert make_topology("ring", 16).neighbors[0] == (1, 15)
    grid = make_topology("meshgrid", 16)
    assert grid.neighbors[0] == (1, 4)
    assert grid.neighbors[5] == (1, 4, 6, 9)
    assert grid.degree(15) == 2
    assert grid.max_degree == 4
    star = make_topology("star", 8)
    assert star.degree(0) == 7
    assert star.neighbors[3] == (0,)


@pytest.mark.parametrize(("n", "degree"), [(10, 3), (16, 4), (7, 2), (30, 5)])
def test_random_regular_is_connected_and_regular(n: int, degree: int) -> None:
    topo = make_topology("random_regular", n, degree=degree, seed=3)
    assert [topo.degree(i) for i in range(n)] == [degree] * n
    assert nx.is_connected(nx.Graph(list(topo.edges)))


def test_erdos_renyi_default_p_is_connected() -> None:
    topo = make_topology("erdos_renyi", 50, seed=1)
    assert nx.is_connected(nx.Graph(list(topo.edges)))
    assert make_topology("erdos_renyi", 6, p=1.0).edges == make_topology("complete", 6).edges


@st.composite
def connected_graphs(draw: st.DrawFn) -> Topology:
    """A random spanning tree plus random extra edges: every connected graph is reachable."""
    n = draw(st.integers(2, 14))
    tree = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]
    node = st.integers(0, n - 1)
    extra = draw(st.lists(st.tuples(node, node).filter(lambda e: e[0] != e[1]), max_size=2 * n))
    return from_edges("random", n, tree + extra)


def _assert_matches_networkx(topo: Topology) -> None:
    dist = topo.hop_distances
    assert dist.dtype == np.int64
    assert np.array_equal(dist, dist.T)
    assert np.all(np.diag(dist) == 0)
    lengths = dict(nx.all_pairs_shortest_path_length(nx.Graph(list(topo.edges))))
    expected = np.array([[lengths[i][j] for j in range(topo.n)] for i in range(topo.n)])
    assert np.array_equal(dist, expected)
    assert np.array_equal(topo.eccentricity, expected.max(axis=1))
    assert topo.diameter == expected.max()


@settings(max_examples=60, deadline=None)
@given(connected_graphs())
def test_hop_distances_match_networkx(topo: Topology) -> None:
    _assert_matches_networkx(topo)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(4, 14), st.integers(0, 10_000), st.sampled_from(["random_regular", "erdos_renyi"])
)
def test_random_families_match_networkx(n: int, seed: int, name: str) -> None:
    degree = 3 if n % 2 == 0 else 2
    _assert_matches_networkx(make_topology(name, n, seed=seed, degree=degree))


def test_cached_arrays_are_read_only() -> None:
    topo = make_topology("ring", 8)
    with pytest.raises(ValueError, match="read-only"):
        topo.hop_distances[0, 1] = 5


@settings(max_examples=40, deadline=None)
@given(connected_graphs(), st.sampled_from(["metropolis", "uniform"]))
def test_mixing_matrix_is_doubly_stochastic(topo: Topology, kind: str) -> None:
    w = topo.mixing_matrix(kind)
    assert w.dtype == np.float64
    assert w.shape == (topo.n, topo.n)
    assert np.allclose(w.sum(axis=0), 1.0)
    assert np.allclose(w.sum(axis=1), 1.0)
    assert np.array_equal(w, w.T)
    assert np.all(w >= 0)
    adjacent = np.eye(topo.n, dtype=bool)
    for i, j in topo.edges:
        adjacent[i, j] = adjacent[j, i] = True
        assert w[i, j] > 0
    assert np.all(w[~adjacent] == 0)


def test_metropolis_weights() -> None:
    w = make_topology("star", 5).mixing_matrix()
    assert w[0, 1] == pytest.approx(1 / 5)
    assert w[1, 1] == pytest.approx(4 / 5)
    assert w[0, 0] == pytest.approx(1 / 5)
    w = make_topology("meshgrid", 9).mixing_matrix("uniform")
    assert w[0, 1] == pytest.approx(1 / 5)
    assert w[0, 0] == pytest.approx(3 / 5)


def test_spectral_gap() -> None:
    assert make_topology("complete", 10).spectral_gap("uniform") == pytest.approx(1.0, abs=1e-12)
    assert make_topology("ring", 64).spectral_gap() < make_topology("ring", 16).spectral_gap()


@pytest.mark.parametrize("n", [5, 8, 16, 17, 64])
def test_ring_metropolis_gap_closed_form(n: int) -> None:
    expected = 1 - (1 / 3 + 2 / 3 * math.cos(2 * math.pi / n))
    assert abs(make_topology("ring", n).spectral_gap("metropolis") - expected) < 1e-9


def test_unknown_mixing_kind() -> None:
    with pytest.raises(TopologyError, match=r"'lazy'.*metropolis, uniform"):
        make_topology("ring", 4).mixing_matrix("lazy")


def test_disconnected_edge_list() -> None:
    with pytest.raises(TopologyError, match=r"not connected: 2 components of sizes \[2, 2\]"):
        from_edges("pairs", 4, [(0, 1), (2, 3)])


def test_empty_edge_list() -> None:
    with pytest.raises(TopologyError, match="n=3 has no edges"):
        from_edges("empty", 3, [])


def test_unknown_name_lists_topologies() -> None:
    with pytest.raises(TopologyError, match="'hypercube'") as info:
        make_topology("hypercube", 8)
    assert all(name in str(info.value) for name in TOPOLOGIES)


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_single_client_is_rejected(name: str) -> None:
    with pytest.raises(TopologyError, match=r"at least 2 clients.*got n=1"):
        make_topology(name, 1)


def test_random_regular_bad_parameters() -> None:
    with pytest.raises(TopologyError, match="degree=3, n=5"):
        make_topology("random_regular", 5, degree=3)
    with pytest.raises(TopologyError, match="degree=6, n=6"):
        make_topology("random_regular", 6, degree=6)


def test_erdos_renyi_gives_up_when_connection_is_hopeless() -> None:
    with pytest.raises(TopologyError, match="100 attempts"):
        make_topology("erdos_renyi", 40, p=0.01)
    with pytest.raises(TopologyError, match=r"p=1\.5"):
        make_topology("erdos_renyi", 4, p=1.5)


def test_from_edges_rejects_bad_edges() -> None:
    with pytest.raises(TopologyError, match="self loop on node 2"):
        from_edges("x", 3, [(0, 1), (1, 2), (2, 2)])
    with pytest.raises(TopologyError, match=r"\(1, 7\)"):
        from_edges("x", 3, [(0, 1), (1, 7)])
    with pytest.raises(TopologyError, match="malformed edge"):
        from_edges("x", 3, [(0, 1, 2)])
    with pytest.raises(TopologyError, match="sorted and unique"):
        Topology("x", 3, ((1, 2), (0, 1)))


def test_edgelist_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "graph.txt"
    path.write_text("# a triangle with a tail\n0 1\n\n2 1  # reversed\n0 2\n1 0\n3 2\n")
    topo = make_topology("edgelist", 4, path=path)
    assert topo.edges == ((0, 1), (0, 2), (1, 2), (2, 3))
    assert topo.diameter == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("0 1\n1 x\n", r"graph.txt:2: expected two node ids 'i j', got '1 x'"),
        ("0 1\n1 2 3\n", r"graph.txt:2: expected two node ids"),
        ("0 1\n\n1 9\n", r"graph.txt:3: node id 9 out of range 0..3"),
        ("0 1\n1 1\n", r"graph.txt:2: self loop on node 1"),
        ("0 1\n2 3\n", r"not connected: 2 components"),
    ],
)
def test_edgelist_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "graph.txt"
    path.write_text(content)
    with pytest.raises(TopologyError, match=message):
        make_topology("edgelist", 4, path=path)


def test_edgelist_missing_file_and_path(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"nope\.txt"):
        make_topology("edgelist", 4, path=tmp_path / "nope.txt")
    with pytest.raises(TopologyError, match="needs path="):
        make_topology("edgelist", 4)


@pytest.mark.parametrize("name", TOPOLOGIES[:-1])
def test_same_arguments_give_equal_topologies(name: str) -> None:
    a = make_topology(name, 12, seed=7)
    b = make_topology(name, 12, seed=7)
    assert a == b
    assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("name", "kwargs"), [("random_regular", {"degree": 3}), ("erdos_renyi", {})]
)
def test_seed_changes_random_graphs(name: str, kwargs: dict[str, int]) -> None:
    graphs = {make_topology(name, 20, seed=s, **kwargs).edges for s in range(5)}
    assert len(graphs) == 5


def test_disconnection_names_the_components_and_the_fix(tmp_path: Path) -> None:
    """Clients 4 and 5 appear in no edge of the file: the graph has four components, listed
    largest first with the node that starts each."""
    path = tmp_path / "graph.txt"
    path.write_text("0 1\n1 2\n3 6\n")
    with pytest.raises(
        TopologyError,
        match=r"'edgelist' with n=7 is not connected: 4 components of sizes \[3, 2, 1, 1\]; "
        r"clients in different components never agree on a model: add edges joining the "
        r"components \(their first nodes: 0, 3, 4, 5\)",
    ):
        make_topology("edgelist", 7, path=path)


def test_hopeless_draws_name_the_key_and_the_threshold() -> None:
    with pytest.raises(
        TopologyError,
        match=r"'erdos_renyi': could not draw a connected G\(n=40, p=0.01\) in 100 attempts; "
        r"raise topology_p well above the connectivity threshold ln\(n\)/n = 0.0922",
    ):
        make_topology("erdos_renyi", 40, p=0.01)


@pytest.mark.parametrize(
    ("name", "n", "kwargs", "message"),
    [
        ("random_regular", 7, {"degree": 3}, r"n\*degree even, got degree=3, n=7"),
        ("random_regular", 8, {"degree": 0}, r"1 <= degree < n, got degree=0, n=8"),
        ("random_regular", 8, {"degree": 1}, r"degree 1 is disjoint pairs, never connected"),
        ("erdos_renyi", 8, {"p": 0.0}, r"0 < p <= 1, got p=0.0: set topology_p"),
        ("hypercube", 8, {}, r"unknown topology 'hypercube'"),
        ("ring", 1, {}, r"at least 2 clients"),
    ],
)
def test_impossible_parameters_are_refused_before_drawing(
    name: str, n: int, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(TopologyError, match=message):
        check_parameters(name, n, **kwargs)
    with pytest.raises(TopologyError, match=message):
        make_topology(name, n, **kwargs)


def test_possible_parameters_pass_the_cheap_check() -> None:
    check_parameters("random_regular", 2, degree=1)
    check_parameters("random_regular", 8, degree=2)
    check_parameters("erdos_renyi", 1024)
    assert make_topology("random_regular", 2, degree=1).edges == ((0, 1),)
