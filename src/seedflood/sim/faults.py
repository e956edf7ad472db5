"""Unreliable links for the simulated transport: loss, duplication, reordering, delay and cuts.

The paper assumes every packet arrives once and at once; volunteer networks lose, repeat, reorder
and delay packets, and sometimes split in two. Injecting those faults per directed edge, from a
seed, lets tests and benchmarks show that anti-entropy (`seedflood.sim.repair`) recovers every
message and that the committed state does not depend on the faults. Each directed edge draws from
its own `random.Random`, so the faults one edge sees do not shift when traffic elsewhere changes,
and the network stays picklable for crash-resume checkpoints.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from seedflood.config import ConfigError, RunConfig
from seedflood.protocol.traffic import Packet
from seedflood.sim.network import SimulatedNetwork
from seedflood.sim.repair import AntiEntropy
from seedflood.topology import Topology

Edge = tuple[int, int]


class Fault(enum.Enum):
    """What a link can do to a packet, hivemind-style: each is injected at its own rate."""

    LOSS = "loss"
    DUPLICATE = "duplicate"
    REORDER = "reorder"
    DELAY = "delay"
    CUT = "cut"


@dataclass(frozen=True)
class LinkFaults:
    """Fault rates, the same on every directed edge, and an optional cut of some edges.

    A reordered packet is handed over behind the packets of its hop that were not reordered, in
    random order among the reordered; a delayed one arrives ``delay_hops`` hops of its channel
    later, after everything sent in between. Cut edges carry nothing during rounds
    [cut_rounds[0], cut_rounds[1]).
    """

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    delay_hops: int = 1
    seed: int = 0
    cut_rounds: tuple[int, int] | None = None
    cut_edges: frozenset[Edge] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in ("duplicate", "reorder", "delay"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"link {name} rate must be in [0, 1], got {rate!r}")
        if not 0.0 <= self.loss < 1.0:
            raise ConfigError(
                f"link loss rate must be in [0, 1): 1 loses everything; got {self.loss}"
            )
        if self.delay_hops < 1:
            raise ConfigError(f"link delay_hops must be >= 1, got {self.delay_hops}")
        if self.cut_rounds is not None and not 0 <= self.cut_rounds[0] < self.cut_rounds[1]:
            raise ConfigError(
                f"cut rounds are [start, end) with 0 <= start < end: {self.cut_rounds}"
            )
        if self.cut_edges and self.cut_rounds is None:
            raise ConfigError("cut edges are given without cut rounds: say when the cut holds")

    @classmethod
    def from_config(cls, config: RunConfig, topology: Topology) -> LinkFaults | None:
        """The faults a run config asks for, or None when it asks for none: the plain network
        then runs exactly as before, without anti-entropy."""
        if config.cut_edges is not None and config.cut_rounds is None:
            raise ConfigError("key 'cut_edges' needs the key 'cut_rounds': when the cut holds")
        rates = (config.link_loss, config.link_duplicate, config.link_reorder, config.link_delay)
        if not any(rates) and config.cut_rounds is None:
            return None
        cut: frozenset[Edge] = frozenset()
        if config.cut_rounds is not None:
            cut = cut_edges(topology, config.cut_edges)
        return cls(
            loss=config.link_loss,
            duplicate=config.link_duplicate,
            reorder=config.link_reorder,
            delay=config.link_delay,
            delay_hops=config.link_delay_hops,
            seed=config.link_seed,
            cut_rounds=config.cut_rounds,
            cut_edges=cut,
        )


def cut_edges(topology: Topology, edges: Sequence[Edge] | None) -> frozenset[Edge]:
    """The undirected edges to cut: those given, each checked against the graph, or by default
    every edge between clients {0 .. n/2 - 1} and {n/2 .. n - 1}."""
    half = topology.n // 2
    if edges is None:
        return frozenset((a, b) for a, b in topology.edges if a < half <= b)
    present = set(topology.edges)
    chosen = set()
    for a, b in edges:
        edge = (min(a, b), max(a, b))
        if edge not in present:
            raise ConfigError(
                f"key 'cut_edges': edge {[a, b]} is not an edge of the {topology.name} graph of "
                f"{topology.n} clients (its edges: {_shown(topology.edges)})"
            )
        chosen.add(edge)
    return frozenset(chosen)


def _shown(edges: Sequence[Edge], limit: int = 12) -> str:
    text = ", ".join(f"{a}-{b}" for a, b in edges[:limit])
    return text + (f", ... ({len(edges)} in all)" if len(edges) > limit else "")


@dataclass(order=True)
class _InFlight:
    due: int
    reordered: bool
    key: float
    sequence: int
    packet: Packet = field(compare=False)


class FaultyNetwork(SimulatedNetwork):
    """The simulated network with `LinkFaults` on every directed edge.

    Bytes are counted when a packet is sent, so a lost packet still costs its sender and a
    duplicated one costs once. Each channel ("flood", and anti-entropy's own) keeps its own clock
    and queue, so a delayed digest never surfaces among flood packets.
    """

    def __init__(
        self, neighbors: Sequence[Sequence[int]], faults: LinkFaults, scalar_format: str = "fp32"
    ) -> None:
        super().__init__(neighbors, scalar_format)
        missing = sorted(
            (a, b) for a, b in faults.cut_edges if (a, b) not in self.traffic or a >= b
        )
        if missing:
            raise ConfigError(f"cut edges {missing} are not edges (a, b), a < b, of this graph")
        self.faults = faults
        self.round = 0
        self.injected: Counter[str] = Counter()
        self._links = {
            edge: random.Random(f"{faults.seed}:{edge[0]}:{edge[1]}") for edge in self.traffic
        }
        self._clock: dict[str, int] = {}
        self._queues: dict[str, list[_InFlight]] = {}
        self._sent = 0

    def at_round(self, round_index: int) -> None:
        """Tell the links which round runs, for the cut's schedule."""
        self.round = round_index

    def describe(self) -> dict[str, Any]:
        return {"faults_injected": dict(self.injected)}

    def live(self, sender: int, receiver: int) -> bool:
        """Whether the edge carries anything this round (a cut edge carries nothing)."""
        rounds = self.faults.cut_rounds
        if rounds is None or not rounds[0] <= self.round < rounds[1]:
            return super().live(sender, receiver)
        return (min(sender, receiver), max(sender, receiver)) not in self.faults.cut_edges

    def carry(self, channel: str, packets: Sequence[Packet]) -> list[Packet]:
        """One hop of ``channel``: inject faults into what was sent, hand over what is due."""
        faults = self.faults
        tick = self._clock[channel] = self._clock.get(channel, 0) + 1
        queue = self._queues.setdefault(channel, [])
        for packet in packets:
            sender, receiver, _ = packet
            if not self.live(sender, receiver):
                self.injected[Fault.CUT.value] += 1
                continue
            link = self._links[(sender, receiver)]
            lost, doubled = link.random() < faults.loss, link.random() < faults.duplicate
            if lost:
                self.injected[Fault.LOSS.value] += 1
                continue
            self.injected[Fault.DUPLICATE.value] += doubled
            for _ in range(1 + doubled):
                delayed, reordered = link.random() < faults.delay, link.random() < faults.reorder
                self.injected[Fault.DELAY.value] += delayed
                self.injected[Fault.REORDER.value] += reordered
                due = tick + faults.delay_hops * delayed
                shuffle = link.random() if reordered else 0.0
                self._sent += 1
                queue.append(_InFlight(due, reordered, shuffle, self._sent, packet))
        arrived = sorted(item for item in queue if item.due <= tick)
        self._queues[channel] = [item for item in queue if item.due > tick]
        return [item.packet for item in arrived]

    @property
    def in_flight(self) -> int:
        """Packets sent but not yet handed over, on every channel."""
        return sum(len(queue) for queue in self._queues.values())


def simulated_links(
    topology: Topology,
    faults: LinkFaults | None,
    *,
    scalar_format: str,
    local_steps: int,
    hops: int,
) -> tuple[SimulatedNetwork, AntiEntropy | None]:
    """The network SeedFlood floods over in the simulator, and the anti-entropy that repairs it:
    perfect links need none, so without faults nothing about a run changes at all."""
    if faults is None:
        return SimulatedNetwork(topology.neighbors, scalar_format), None
    network = FaultyNetwork(topology.neighbors, faults, scalar_format)
    return network, AntiEntropy(topology, local_steps=local_steps, hops=hops)
