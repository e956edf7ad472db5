"""GWTF scenarios: who serves which pipeline stage, where, how fast, and what links cost.

A scenario holds data holders (sources and sinks of microbatches) and relays (each serves one
stage, with a compute time per microbatch, a capacity in microbatches per iteration and a region).
Links between regions come from a table of inter-region latency and bandwidth. The edge cost
between consecutive nodes is DESIGN.md §3's

    d_ij = (c_i + c_j)/2 + (λ_ij + λ_ji)/2 + 2·size/(β_ij + β_ji)

with c = compute seconds per microbatch (0 for a data holder), λ in seconds, β in bytes/s and
size the activation bytes of one microbatch.

A scenario's ``link_spread`` stretches how unlike its inter-region links are, for sweeping the
paper's heterogeneous-communication claim without changing who is where: each link's latency and
bandwidth keep their ratio to the table's geometric mean raised to that power, so 0 makes every
inter-region link the mean link, 1 is the measured table (the default) and 2 squares every ratio.
Same-region links stay at 1 ms and 2 GiB/s: what is stretched is the geography.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

# Inter-region latency (ms) and bandwidth (Mbit/s), symmetric. The figures are the public
# cloud inter-region measurements used by the CheckFree / SkipPipe training simulators
# (github.com/NikolayBlagoev/PipelineRecovery, communication/communication_costs.py, 2025),
# which list 12 regions; the NL–London bandwidth there (0.000237 GiB/s) is a typo for 0.237 and
# is corrected here. Same-region links: 1 ms, 2 GiB/s.
REGIONS: tuple[str, ...] = (
    "australia",
    "belgium",
    "canada",
    "germany",
    "iowa",
    "japan",
    "los-angeles",
    "netherlands",
    "oregon",
    "singapore",
    "taiwan",
    "london",
)
_TABLE = """
australia belgium 129 80 | australia canada 98 108 | australia germany 125.5 86
australia iowa 84 92 | australia japan 58 113 | australia los-angeles 69 120
australia netherlands 128 78 | australia oregon 68 120 | australia singapore 48 244
australia taiwan 67 172 | australia london 132 77 | belgium canada 41 163
belgium germany 4 1987 | belgium iowa 49 232 | belgium japan 112 96
belgium los-angeles 70 159 | belgium netherlands 3 1987 | belgium oregon 66 171
belgium singapore 83 132 | belgium taiwan 105 102 | belgium london 3.5 1987
canada germany 44 261 | canada iowa 14 620 | canada japan 74 148 | canada los-angeles 35 250
canada netherlands 42 205 | canada oregon 30.5 386 | canada singapore 107 98
canada taiwan 89 120 | canada london 38.5 298 | germany iowa 53.5 218 | germany japan 112 91
germany los-angeles 73 150 | germany netherlands 3.5 1987 | germany oregon 68 122
germany singapore 80 102 | germany taiwan 102 103 | germany london 6.6 1546
iowa japan 72.5 114 | iowa los-angeles 23.4 504 | iowa netherlands 51 224 | iowa oregon 19.3 740
iowa singapore 101.5 104 | iowa taiwan 88 105 | iowa london 48.1 179 | japan los-angeles 50 228
japan netherlands 108.5 93 | japan oregon 46.2 250 | japan singapore 35.6 320
japan taiwan 19.2 628 | japan london 107 73 | los-angeles netherlands 71.5 117
los-angeles oregon 12.4 971 | los-angeles singapore 79.5 138 | los-angeles taiwan 64 133
los-angeles london 68 122 | netherlands oregon 67 167 | netherlands singapore 81.5 134
netherlands taiwan 105.5 98 | netherlands london 4.8 1987 | oregon singapore 78.5 138
oregon taiwan 59.5 191 | oregon london 64 174 | singapore taiwan 23.2 507
singapore london 85 128 | taiwan london 109.5 73
"""
SAME_REGION_LATENCY_S = 1e-3
SAME_REGION_BANDWIDTH = 2 * 2**30


def _links() -> dict[tuple[str, str], tuple[float, float]]:
    links = {}
    for entry in _TABLE.replace("\n", "|").split("|"):
        if entry.strip():
            a, b, latency_ms, mbit = entry.split()
            link = (float(latency_ms) / 1e3, float(mbit) * 1e6 / 8)
            links[(a, b)] = links[(b, a)] = link
    return links


LINKS = _links()
# The centres link_spread stretches around: geometric means over the table's region pairs.
MEAN_LATENCY_S = statistics.geometric_mean(latency for latency, _ in LINKS.values())
MEAN_BANDWIDTH = statistics.geometric_mean(bandwidth for _, bandwidth in LINKS.values())


class ScenarioError(ValueError):
    """A scenario that cannot be run, named precisely."""


class NoRelayLeft(RuntimeError):
    """A stage with no relay a microbatch can go to. The churn model keeps one live relay per
    stage, so this means a schedule or scenario broke that rule; every router says it alike."""

    def __init__(self, stage: int) -> None:
        super().__init__(
            f"stage {stage} has no usable relay left: every one crashed, left or is known dead, "
            "and the churn model keeps at least one per stage"
        )
        self.stage = stage


def link(a: str, b: str) -> tuple[float, float]:
    """(latency in seconds, bandwidth in bytes/s) between two regions."""
    if a == b:
        return SAME_REGION_LATENCY_S, SAME_REGION_BANDWIDTH
    try:
        return LINKS[(a, b)]
    except KeyError:
        unknown = a if a not in REGIONS else b
        raise ScenarioError(f"unknown region {unknown!r}; known: {', '.join(REGIONS)}") from None


def activation_bytes(micro_batch: int, seq_len: int, hidden: int, bytes_per_value: int = 4) -> int:
    """Bytes of one microbatch's activations (or their gradient) between two stages."""
    return micro_batch * seq_len * hidden * bytes_per_value


@dataclass(frozen=True)
class Relay:
    """A volunteer serving one stage: seconds per microbatch forward (backward costs twice
    that), how many microbatches it can hold per iteration, and where it is."""

    name: str
    stage: int
    compute_s: float
    capacity: int
    region: str


@dataclass(frozen=True)
class DataHolder:
    """Injects ``microbatches`` per iteration and takes them back after the last stage."""

    name: str
    region: str
    microbatches: int


@dataclass(frozen=True)
class Scenario:
    stages: int
    relays: tuple[Relay, ...]
    holders: tuple[DataHolder, ...]
    activation_bytes: int
    link_spread: float = 1.0
    nodes: dict[str, Relay | DataHolder] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes: dict[str, Relay | DataHolder] = {}
        for node in (*self.holders, *self.relays):
            if node.name in nodes:
                raise ScenarioError(f"two nodes are named {node.name!r}")
            if node.region not in REGIONS:
                raise ScenarioError(
                    f"node {node.name!r} is in unknown region {node.region!r}; known: "
                    f"{', '.join(REGIONS)}"
                )
            nodes[node.name] = node
        object.__setattr__(self, "nodes", nodes)
        if not (math.isfinite(self.link_spread) and self.link_spread >= 0):
            raise ScenarioError(f"link_spread must be a number >= 0; got {self.link_spread}")
        if self.stages < 1:
            raise ScenarioError(f"stages must be at least 1; got {self.stages}")
        if not self.holders:
            raise ScenarioError("a scenario needs at least one data holder")
        for relay in self.relays:
            if not 0 <= relay.stage < self.stages:
                raise ScenarioError(
                    f"relay {relay.name!r} serves stage {relay.stage}; stages are "
                    f"0..{self.stages - 1}"
                )
            if relay.compute_s <= 0 or relay.capacity < 1:
                raise ScenarioError(
                    f"relay {relay.name!r} needs compute_s > 0 and capacity >= 1; got "
                    f"{relay.compute_s} and {relay.capacity}"
                )
        for stage in range(self.stages):
            if not self.stage(stage):
                raise ScenarioError(f"no relay serves stage {stage}")

    def stage(self, index: int) -> list[Relay]:
        return [r for r in self.relays if r.stage == index]

    def compute(self, name: str) -> float:
        node = self.nodes[name]
        return node.compute_s if isinstance(node, Relay) else 0.0

    def link(self, a: str, b: str) -> tuple[float, float]:
        """(latency in seconds, bandwidth in bytes/s) between two regions, stretched by
        ``link_spread``; written so that a spread of 1 returns the table's figures bit for bit."""
        latency, bandwidth = link(a, b)
        if a == b:
            return latency, bandwidth
        keep = 1 - self.link_spread
        return (
            latency**self.link_spread * MEAN_LATENCY_S**keep,
            bandwidth**self.link_spread * MEAN_BANDWIDTH**keep,
        )

    def edge_cost(self, a: str, b: str) -> float:
        """d_ab: half of each end's compute, mean latency, and the transfer over mean bandwidth
        (forward one way, backward the other)."""
        latency, bandwidth = self.link(self.nodes[a].region, self.nodes[b].region)
        return (self.compute(a) + self.compute(b)) / 2 + latency + self.activation_bytes / bandwidth

    def path_cost(self, path: tuple[str, ...]) -> float:
        return sum(self.edge_cost(a, b) for a, b in itertools.pairwise(path))

    def without(self, name: str) -> Scenario:
        """The scenario after ``name`` left or crashed."""
        return replace(
            self,
            relays=tuple(r for r in self.relays if r.name != name),
            holders=tuple(h for h in self.holders if h.name != name),
        )

    def with_relay(self, relay: Relay) -> Scenario:
        return self.with_relays((*self.relays, relay))

    def with_relays(self, relays: tuple[Relay, ...]) -> Scenario:
        """The same stages, holders and links served by ``relays``."""
        return replace(self, relays=relays)

    def to_dict(self) -> dict[str, Any]:
        """The default link spread is left out, so files written before it existed still say
        exactly what such a scenario holds."""
        spread = {} if self.link_spread == 1.0 else {"link_spread": self.link_spread}
        return {
            "stages": self.stages,
            "activation_bytes": self.activation_bytes,
            **spread,
            "holders": [asdict(h) for h in self.holders],
            "relays": [asdict(r) for r in self.relays],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        try:
            return cls(
                stages=int(data["stages"]),
                relays=tuple(Relay(**r) for r in data["relays"]),
                holders=tuple(DataHolder(**h) for h in data["holders"]),
                activation_bytes=int(data["activation_bytes"]),
                link_spread=float(data.get("link_spread", 1.0)),
            )
        except KeyError as missing:
            raise ScenarioError(f"scenario lacks the key {missing}") from None
        except TypeError as error:
            raise ScenarioError(f"bad relay or holder entry: {error}") from None

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: Path) -> Scenario:
        if not path.is_file():
            raise ScenarioError(f"no scenario file at {path}")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ScenarioError(f"{path} is not valid YAML: {error}") from None
        if not isinstance(data, dict):
            raise ScenarioError(f"{path}: a scenario is a YAML mapping")
        return cls.from_dict(data)


def random_scenario(
    seed: int,
    *,
    stages: int = 4,
    relays_per_stage: int = 4,
    holders: int = 1,
    microbatches: int = 8,
    regions: int = 10,
    heterogeneous: bool = True,
    compute_s: float = 0.5,
    activation: int = activation_bytes(8, 256, 576),
    link_spread: float = 1.0,
) -> Scenario:
    """A seeded random scenario over the first ``regions`` regions. Heterogeneous relays differ
    up to 4x in speed and hold 1 to 4 microbatches; homogeneous ones are all alike (capacity 2).
    ``link_spread`` draws nothing, so every spread of one seed puts the same relays in the same
    places."""
    if not 1 <= regions <= len(REGIONS):
        raise ScenarioError(f"regions must be 1..{len(REGIONS)}; got {regions}")
    rng = random.Random(seed)
    places = REGIONS[:regions]
    relays = []
    for stage in range(stages):
        for k in range(relays_per_stage):
            speed = rng.uniform(1.0, 4.0) if heterogeneous else 1.0
            relays.append(
                Relay(
                    name=f"s{stage}r{k}",
                    stage=stage,
                    compute_s=compute_s * speed,
                    capacity=rng.randint(1, 4) if heterogeneous else 2,
                    region=rng.choice(places),
                )
            )
    data = tuple(DataHolder(f"d{k}", rng.choice(places), microbatches) for k in range(holders))
    return Scenario(stages, tuple(relays), data, activation, link_spread)
