"""Communication graphs for decentralized training.

Every algorithm in seedflood only ever talks to graph neighbours, so the graph decides both
the per-round communication cost (degrees) and how fast information spreads (diameter,
spectral gap of the gossip matrix). All graphs here are undirected and must be connected:
on a disconnected graph the clients can never agree on a model, and that is a configuration
error we want to report at construction time rather than after hours of training.

Topologies are immutable values: the same arguments give an equal ``Topology``, so runs are
reproducible and a topology can be used as a dictionary key or cache key.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np

TOPOLOGIES: tuple[str, ...] = (
    "ring",
    "meshgrid",
    "torus",
    "complete",
    "star",
    "exponential",
    "random_regular",
    "erdos_renyi",
    "edgelist",
)
MIXING_KINDS: tuple[str, ...] = ("metropolis", "uniform")
MAX_ATTEMPTS = 100
_SHOWN_COMPONENTS = 5

Edge = tuple[int, int]


class TopologyError(ValueError):
    """Raised for any invalid topology request, so callers can catch one type for config errors."""


def _frozen(array: np.ndarray) -> np.ndarray:
    """Cached arrays are shared by every caller, so a stray in-place edit must fail loudly."""
    array.flags.writeable = False
    return array


def _check_n(name: str, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise TopologyError(f"topology {name!r}: need at least 2 clients (an int n), got n={n!r}")


@dataclass(frozen=True)
class Topology:
    """An undirected, connected graph on clients ``0..n-1``.

    ``edges`` must already be in canonical form (``i < j``, sorted, unique); use
    :func:`from_edges` to build one from arbitrary pairs. The canonical form is what makes
    equality and hashing of topologies meaningful.
    """

    name: str
    n: int
    edges: tuple[Edge, ...]

    def __post_init__(self) -> None:
        _check_n(self.name, self.n)
        if not self.edges:
            raise TopologyError(f"topology {self.name!r} with n={self.n} has no edges")
        for i, j in self.edges:
            if i == j:
                raise TopologyError(f"topology {self.name!r}: self loop on node {i}")
            if not 0 <= i < j < self.n:
                raise TopologyError(
                    f"topology {self.name!r}: edge ({i}, {j}) is not of the form (i, j) with "
                    f"0 <= i < j < n={self.n}"
                )
        if any(a >= b for a, b in itertools.pairwise(self.edges)):
            raise TopologyError(
                f"topology {self.name!r}: edges must be sorted and unique; use from_edges()"
            )
        graph = nx.empty_graph(self.n)
        graph.add_edges_from(self.edges)
        components = sorted(nx.connected_components(graph), key=lambda c: (-len(c), min(c)))
        if len(components) > 1:
            sizes = [len(c) for c in components]
            firsts = ", ".join(str(min(c)) for c in components[:_SHOWN_COMPONENTS])
            raise TopologyError(
                f"topology {self.name!r} with n={self.n} is not connected: {len(components)} "
                f"components of sizes {sizes}; clients in different components never agree on "
                f"a model: add edges joining the components (their first nodes: {firsts}) or "
                "match clients to the nodes the graph uses"
            )

    def __repr__(self) -> str:
        return f"Topology(name={self.name!r}, n={self.n}, edges={len(self.edges)})"

    @cached_property
    def neighbors(self) -> tuple[tuple[int, ...], ...]:
        adjacency: list[list[int]] = [[] for _ in range(self.n)]
        for i, j in self.edges:
            adjacency[i].append(j)
            adjacency[j].append(i)
        return tuple(tuple(sorted(a)) for a in adjacency)

    def degree(self, i: int) -> int:
        return len(self.neighbors[i])

    @cached_property
    def max_degree(self) -> int:
        return max(len(a) for a in self.neighbors)

    @cached_property
    def directed_edges(self) -> tuple[Edge, ...]:
        """Both directions of every edge: the unit of per-round message accounting."""
        return tuple(sorted(self.edges + tuple((j, i) for i, j in self.edges)))

    @cached_property
    def hop_distances(self) -> np.ndarray:
        """All-pairs hops: a message flooded from i first reaches j after this many rounds."""
        dist = np.empty((self.n, self.n), dtype=np.int64)
        for source in range(self.n):
            row = [-1] * self.n
            row[source] = 0
            queue = deque([source])
            while queue:
                u = queue.popleft()
                for v in self.neighbors[u]:
                    if row[v] < 0:
                        row[v] = row[u] + 1
                        queue.append(v)
            dist[source] = row
        return _frozen(dist)

    @cached_property
    def eccentricity(self) -> np.ndarray:
        return _frozen(self.hop_distances.max(axis=1))

    @cached_property
    def diameter(self) -> int:
        return int(self.eccentricity.max())

    def mixing_matrix(self, kind: str = "metropolis") -> np.ndarray:
        """Symmetric doubly stochastic gossip weights, so averaging preserves the global mean.

        Metropolis–Hastings weights need only the two endpoint degrees (locally computable);
        uniform weights need the global max degree but treat every edge alike. A fresh array
        is returned because callers often scale or modify it.
        """
        if kind not in MIXING_KINDS:
            raise TopologyError(f"unknown mixing kind {kind!r}; allowed: {', '.join(MIXING_KINDS)}")
        ends = np.asarray(self.edges, dtype=np.int64)
        if kind == "metropolis":
            deg = np.array([len(a) for a in self.neighbors], dtype=np.float64)
            weights = 1.0 / (1.0 + np.maximum(deg[ends[:, 0]], deg[ends[:, 1]]))
        else:
            weights = np.full(len(ends), 1.0 / (self.max_degree + 1))
        w = np.zeros((self.n, self.n), dtype=np.float64)
        w[ends[:, 0], ends[:, 1]] = weights
        w[ends[:, 1], ends[:, 0]] = weights
        w[np.diag_indices(self.n)] = 1.0 - w.sum(axis=1)
        return w

    def spectral_gap(self, kind: str = "metropolis") -> float:
        """1 - second largest |eigenvalue|: the per-round contraction rate of gossip averaging."""
        magnitudes = np.sort(np.abs(np.linalg.eigvalsh(self.mixing_matrix(kind))))[::-1]
        return float(1.0 - magnitudes[1])


def from_edges(name: str, n: int, edges: Iterable[tuple[int, int]]) -> Topology:
    """Canonicalize arbitrary pairs (either orientation, duplicates allowed) and validate."""
    canonical: set[Edge] = set()
    for pair in edges:
        try:
            i, j = (int(x) for x in pair)
        except (TypeError, ValueError) as err:
            raise TopologyError(f"topology {name!r}: malformed edge {pair!r}") from err
        canonical.add((min(i, j), max(i, j)))
    return Topology(name=name, n=n, edges=tuple(sorted(canonical)))


def grid_shape(n: int) -> tuple[int, int]:
    """Most square rows × cols = n with rows <= cols; a prime n degenerates to 1 × n (a path)."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def _grid_edges(n: int, wrap: bool) -> list[Edge]:
    rows, cols = grid_shape(n)
    edges = []
    for r, c in itertools.product(range(rows), range(cols)):
        u = r * cols + c
        # Wrapping a dimension of length <= 2 would only repeat an edge or add a self loop.
        if c + 1 < cols or (wrap and cols > 2):
            edges.append((u, r * cols + (c + 1) % cols))
        if r + 1 < rows or (wrap and rows > 2):
            edges.append((u, ((r + 1) % rows) * cols + c))
    return edges


def _attempt_seed(seed: int, attempt: int) -> np.random.SeedSequence:
    """Independent, reproducible streams per retry, without seed + attempt collisions."""
    return np.random.SeedSequence([seed % 2**64, attempt])


def _first_connected(
    name: str, n: int, draw: Callable[[int], list[Edge]], what: str, fix: str
) -> Topology:
    """Rejection sampling: conditioning on connectivity keeps the draw reproducible per seed."""
    last_error: TopologyError | None = None
    for attempt in range(MAX_ATTEMPTS):
        try:
            return from_edges(name, n, draw(attempt))
        except TopologyError as err:
            last_error = err
    raise TopologyError(
        f"topology {name!r}: could not draw a connected {what} in {MAX_ATTEMPTS} attempts; "
        f"{fix} (last attempt: {last_error})"
    )


def _erdos_renyi_p(n: int, p: float | None) -> float:
    return min(1.0, 2 * math.log(n) / n) if p is None else p


def check_parameters(name: str, n: int, *, degree: int = 3, p: float | None = None) -> None:
    """Refuse the requests that no draw can satisfy, cheaply and before anything is built, so a
    config can be checked in its first second: the fix is named in config keys because that is
    where the person who reads the error sets them."""
    if name not in TOPOLOGIES:
        raise TopologyError(f"unknown topology {name!r}; allowed: {', '.join(TOPOLOGIES)}")
    _check_n(name, n)
    if name == "random_regular":
        got = f"got degree={degree}, n={n}"
        if not 1 <= degree < n:
            raise TopologyError(
                f"topology 'random_regular' needs 1 <= degree < n, {got}: set topology_degree "
                f"below clients"
            )
        if n * degree % 2:
            raise TopologyError(
                f"topology 'random_regular' needs n*degree even, {got}: make topology_degree "
                "or clients even"
            )
        if degree == 1 and n > 2:
            raise TopologyError(
                f"topology 'random_regular' with degree 1 is disjoint pairs, never connected "
                f"for n > 2, {got}: set topology_degree to 2 or more"
            )
    if name == "erdos_renyi" and not 0 < _erdos_renyi_p(n, p) <= 1:
        raise TopologyError(f"topology 'erdos_renyi' needs 0 < p <= 1, got p={p}: set topology_p")


def _random_regular(n: int, degree: int, seed: int) -> Topology:
    def draw(attempt: int) -> list[Edge]:
        nx_seed = int(_attempt_seed(seed, attempt).generate_state(1)[0])
        return list(nx.random_regular_graph(degree, n, seed=nx_seed).edges)

    fix = "raise topology_degree (degree 3 or more is connected almost surely)"
    return _first_connected("random_regular", n, draw, f"{degree}-regular graph on n={n}", fix)


def _erdos_renyi(n: int, p: float | None, seed: int) -> Topology:
    p = _erdos_renyi_p(n, p)
    rows, cols = np.triu_indices(n, k=1)

    def draw(attempt: int) -> list[Edge]:
        keep = np.random.default_rng(_attempt_seed(seed, attempt)).random(len(rows)) < p
        return list(zip(rows[keep].tolist(), cols[keep].tolist(), strict=True))

    fix = (
        f"raise topology_p well above the connectivity threshold ln(n)/n = "
        f"{math.log(n) / n:.3g}, or leave it unset for 2 ln(n)/n"
    )
    return _first_connected("erdos_renyi", n, draw, f"G(n={n}, p={p:g})", fix)


def _read_edgelist(path: str | os.PathLike[str], n: int) -> Topology:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise TopologyError(f"cannot read edge list {os.fspath(path)!r}: {err}") from err
    edges = []
    for lineno, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{os.fspath(path)}:{lineno}"
        fields = text.split()
        if len(fields) != 2 or not all(x.lstrip("-").isdigit() for x in fields):
            raise TopologyError(f"{where}: expected two node ids 'i j', got {raw.strip()!r}")
        i, j = int(fields[0]), int(fields[1])
        for node in (i, j):
            if not 0 <= node < n:
                raise TopologyError(f"{where}: node id {node} out of range 0..{n - 1}")
        if i == j:
            raise TopologyError(f"{where}: self loop on node {i}")
        edges.append((i, j))
    return from_edges("edgelist", n, edges)


def make_topology(
    name: str,
    n: int,
    *,
    seed: int = 0,
    degree: int = 3,
    p: float | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Topology:
    """Build a named topology; options that a topology does not use are ignored.

    ``degree`` is for ``random_regular``, ``p`` for ``erdos_renyi`` (default
    ``min(1, 2 ln n / n)``, comfortably above the connectivity threshold ``ln n / n``),
    ``path`` for ``edgelist``, ``seed`` for both random families.
    """
    check_parameters(name, n, degree=degree, p=p)
    if name == "random_regular":
        return _random_regular(n, degree, seed)
    if name == "erdos_renyi":
        return _erdos_renyi(n, p, seed)
    if name == "edgelist":
        if path is None:
            raise TopologyError("topology 'edgelist' needs path= to an edge list file")
        return _read_edgelist(path, n)
    if name == "ring":
        edges = [(i, (i + 1) % n) for i in range(n)]
    elif name in ("meshgrid", "torus"):
        edges = _grid_edges(n, wrap=name == "torus")
    elif name == "complete":
        edges = list(itertools.combinations(range(n), 2))
    elif name == "star":
        edges = [(0, i) for i in range(1, n)]
    else:
        edges = [(i, (i + 2**k) % n) for i in range(n) for k in range(n.bit_length()) if 2**k < n]
    return from_edges(name, n, edges)
