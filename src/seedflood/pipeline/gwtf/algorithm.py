"""GWTF's decentralized flow algorithm: nodes that know only their own links and flows, their
neighbours' advertised costs and the messages they receive route microbatches near-optimally.

Reconstructed from the first author's 2024 prototype (docs: /work/shared/papers/gwtf.md §4.3).
Every unit of flow is a chain of *links*, one per hop; each link has an up end (the sender) and a
down end (the receiver), and each end is held by exactly one node. A node pairs each inflow link
with one outflow link (a data holder's inflows are its own microbatches, the last stage's end the
path), and knows, per unit it carries, the cost from the holder to itself (prefix) and from itself
to the end (suffix); the path cost is their sum.

- Cost-to-end gossip (distance vector): a relay advertises to the previous stage what one more
  unit through it would cost to the end, over relays that still have room.
- Request/accept: a node with an unrouted unit requests one link from its cheapest next relay,
  quoting the advertised cost; the receiver accepts only if that is still its cost, else rejects
  with its true cost.
- Stale flows: an accepted inflow not routed on within ``STALE_TICKS`` is pushed back, an outflow
  left without inflow for as long is cancelled, and periodic audits drop link ends whose other
  end no longer exists.
- Improvement moves between same-stage nodes, from flow tables they share: SWAP exchanges the
  downstream parts of two units, REDIRECT moves a unit to a peer with room. The node asked
  accepts if the larger cost of the affected paths drops, else with probability exp(-Δ/T);
  accepting cools T by ``cooling``, and below ``FROZEN`` × T0 only improvements pass, so runs end.
- Move windows: costs travel a hop per tick, so on long pipelines moves made at will are weighed
  on costs an earlier move already changed. A frozen node moves only in its stage's window of a
  sweep over the stages, which lets every move's new costs arrive before the next window that
  reads them; T also cools as a window opens, so every node freezes within a set number of
  sweeps. Quiet for two sweeps, the routing has settled.
- Repair: a crashed node's neighbours drop its links; units left without a next hop are
  re-requested, outflows left without inflow are offered to the next request, then cancelled.

A node that hands a link end to a peer keeps a forwarding pointer, so messages in flight about
that link still reach its holder.

The message vocabulary lives in ``gwtf.messages``, the link ends and their request/accept/
push-back protocol in ``gwtf.links``, the annealing moves in ``gwtf.moves``; this module
completes the node with its tick and churn repair, and runs the nodes.
"""

from __future__ import annotations

import itertools
import logging
import random
import statistics
import time
from dataclasses import replace

from seedflood.pipeline.costs import Relay, Scenario
from seedflood.pipeline.flow import FlowSolution
from seedflood.pipeline.gwtf.links import HOLDERS, STALE_TICKS, Neighbours
from seedflood.pipeline.gwtf.messages import Kind, Mailbox, Message
from seedflood.pipeline.gwtf.moves import AnnealingNode, sweep_ticks

__all__ = ["STALE_TICKS", "DecentralizedFlow", "Kind", "Message", "decentralized_flow"]

log = logging.getLogger(__name__)

MOVE_PROBABILITY = 0.3  # per tick it may move (take_turn), an idle node looks for a move
T0_PER_EDGE = 2.0  # T0 in typical edge costs (results hardly change from 0.5 to 4)
# Sweeps a run may take: ANNEAL_SWEEPS to freeze, the descent (at most 12 measured at 12-16
# stages), two quiet ones to call it settled, and room to spare.
MAX_SWEEPS = 30


class FlowNode(AnnealingNode):
    """A data holder (stage -1) or a relay. It reads only its own links (``edges``), its flows,
    the costs the next stage advertised and the tables its same-stage peers shared."""

    def act(self, tick: int) -> None:
        if self.request is None:
            self.request_unit()
        if self.request is None:
            self.push_back_stale()
        self.cancel_dangling()
        turn = self.take_turn(tick)
        if (
            turn
            and self.proposal is None
            and self.request is None
            and self.rng.random() < MOVE_PROBABILITY
        ):
            self.try_move()
        self.advertise()
        self.share_table(tick)
        self.audit(tick)

    def peer_down(self, name: str) -> None:
        """A failure detector reported ``name`` gone: release every link to it, and warm up
        again, since the best routing may now differ by more than one move."""
        if not any(name in peers for peers in (self.prev, self.same, self.next)):
            return
        for peers in (self.prev, self.same, self.next):
            if name in peers:
                peers.remove(name)
        self.temperature = self.t0
        for table in (self.edges, self.advertised, self.tables):
            table.pop(name, None)
        for moved in (self.moved_in, self.moved_out):
            for link in [k for k, holder in moved.items() if holder == name]:
                del moved[link]
        for link in [k for k, o in self.outflows.items() if o.next == name]:
            self.drop_outflow(link)
        for link in [k for k, i in self.inflows.items() if i.prev == name]:
            self.drop_inflow(link)
        if self.request is not None and self.request.peer == name:
            self.request = None
        self.settle(name)

    def peer_up(self, name: str, stage: int) -> None:
        """``name`` joined at ``stage``: learn its links (a new upstream peer needs our cost),
        and warm up again to make room for it."""
        if stage in (self.stage - 1, self.stage, self.stage + 1):
            self.temperature = self.t0
        if stage == self.stage - 1:
            self.prev.append(name)
            self.edges[name] = self.measure(self.name, name)
            self.send(Kind.ADVERT, name, cost=self.cost_to_end())
        elif stage == self.stage + 1:
            self.next.append(name)
            self.edges[name] = self.measure(self.name, name)
        elif stage == self.stage:
            self.same.append(name)
            self.table_sent = None


def typical_edge_cost(scenario: Scenario) -> float:
    """Median cost of the edges a path can take: the scale of annealing's temperature."""
    stages = [[h.name for h in scenario.holders]]
    stages += [[r.name for r in scenario.stage(k)] for k in range(scenario.stages)]
    return statistics.median(
        scenario.edge_cost(a, b)
        for before, after in itertools.pairwise(stages)
        for a, b in itertools.product(before, after)
    )


class DecentralizedFlow:
    """Runs one FlowNode per holder and relay over a Mailbox, tick by tick.

    The driver only delivers messages, plays failure detector on ``remove``/``add`` and reads
    the routed paths off the nodes for reporting; no node sees more than its own state. Every
    node draws from its own ``random.Random`` seeded by (seed, name), so a run is a function of
    the seed. ``t0`` defaults to ``T0_PER_EDGE`` times the scenario's typical edge cost, the
    prototype's T0 ≈ 2 read in units of an edge rather than of its integer costs.
    """

    def __init__(
        self, scenario: Scenario, seed: int, t0: float | None = None, cooling: float = 0.95
    ) -> None:
        self.scenario, self.seed, self.cooling = scenario, seed, cooling
        self.t0 = T0_PER_EDGE * typical_edge_cost(scenario) if t0 is None else t0
        self.mailbox = Mailbox()
        self.tick = 0
        self.nodes: dict[str, FlowNode] = {}
        self.retired_serials: dict[str, int] = {}
        for holder in scenario.holders:
            self._spawn(holder.name, HOLDERS, holder.microbatches)
        for relay in scenario.relays:
            self._spawn(relay.name, relay.stage, relay.capacity)

    @property
    def messages_sent(self) -> int:
        return self.mailbox.sent

    def run(self, max_ticks: int | None = None, patience: int | None = None) -> FlowSolution:
        """Tick until no flow changed for ``patience`` ticks, or ``max_ticks``: a run cut short
        there is marked unsettled and said in the log. Both count sweeps by default, since a
        sweep's length grows with the stages: ``MAX_SWEEPS``, and two for ``patience``, because
        once frozen a node moves only in its stage's window, so a quiet shorter than a sweep may
        be a pause between windows, and a node tries a move in only most of its windows."""
        sweep = sweep_ticks(self.scenario.stages)
        max_ticks = MAX_SWEEPS * sweep if max_ticks is None else max_ticks
        patience = 2 * sweep if patience is None else patience
        start = time.perf_counter()
        quiet = 0
        for _ in range(max_ticks):
            quiet = 0 if self.step() else quiet + 1
            if quiet >= patience:
                return self.solution(time.perf_counter() - start)
        solution = replace(self.solution(time.perf_counter() - start), settled=False)
        log.warning(
            "the decentralized flow stopped at its %d-tick limit before it settled: it routes %d "
            "microbatches and may route fewer, or slower, than it would with more ticks",
            max_ticks,
            solution.value,
        )
        return solution

    def step(self) -> bool:
        """One tick: deliver the messages posted during the last, let every node act; whether
        any node's flows changed."""
        self.tick += 1
        for message in self.mailbox.collect():
            receiver = self.nodes.get(message.receiver)
            if receiver is not None:
                receiver.receive(message)
        for node in self.nodes.values():
            node.act(self.tick)
        changed = any(node.changed for node in self.nodes.values())
        for node in self.nodes.values():
            node.changed = False
        return changed

    def remove(self, name: str) -> None:
        """``name`` crashed or left: its messages are lost and its neighbours repair."""
        if name not in self.nodes:
            raise ValueError(f"no node named {name!r}; nodes: {', '.join(self.nodes)}")
        self.scenario = self.scenario.without(name)
        self.retired_serials[name] = self.nodes.pop(name).serial
        self.mailbox.drop(name)
        for node in self.nodes.values():
            node.peer_down(name)

    def add(self, relay: Relay) -> None:
        """``relay`` joined: it learns its stage's neighbours and they learn of it."""
        self.scenario = self.scenario.with_relay(relay)
        for node in self.nodes.values():
            node.peer_up(relay.name, relay.stage)
        self._spawn(relay.name, relay.stage, relay.capacity)

    def solution(self, seconds: float = 0.0) -> FlowSolution:
        """The units routed from a holder all the way to the last stage, end to end."""
        paths = []
        for holder in self.scenario.holders:
            for link, out in self.nodes[holder.name].outflows.items():
                path = self._trace(holder.name, link, out.next) if out.inflow else None
                if path is not None:
                    paths.append(path)
        return FlowSolution.of(self.scenario, paths, seconds)

    def _trace(self, sender: str, link: str, receiver: str) -> tuple[str, ...] | None:
        path = [sender]
        while True:
            node = self.nodes.get(receiver)
            inflow = node.inflows.get(link) if node else None
            if node is None or inflow is None or inflow.prev != sender:
                return None
            path.append(receiver)
            if node.last:
                return tuple(path)
            if inflow.out is None:
                return None
            sender, link, receiver = receiver, inflow.out, node.outflows[inflow.out].next

    def _measure(self, a: str, b: str) -> float:
        """A node measuring its own link; joins change the scenario, so it is looked up late."""
        return self.scenario.edge_cost(a, b)

    def _members(self, stage: int) -> tuple[str, ...]:
        if stage == HOLDERS:
            return tuple(h.name for h in self.scenario.holders)
        return tuple(r.name for r in self.scenario.stage(stage))

    def _spawn(self, name: str, stage: int, capacity: int) -> None:
        neighbours = Neighbours(
            prev=self._members(stage - 1) if stage > HOLDERS else (),
            same=tuple(n for n in self._members(stage) if n != name),
            next=self._members(stage + 1) if stage + 1 < self.scenario.stages else (),
        )
        node = self.nodes[name] = FlowNode(
            name,
            stage,
            capacity,
            stage == self.scenario.stages - 1,
            neighbours,
            self._measure,
            self.mailbox,
            random.Random(f"{self.seed}:{name}"),
            self.t0,
            self.cooling,
            self.scenario.stages,
        )
        # a relay that comes back under its old name must not reuse link names its
        # neighbours may still hold from before it left
        node.serial = self.retired_serials.get(name, 0)


def decentralized_flow(scenario: Scenario, seed: int, max_ticks: int | None = None) -> FlowSolution:
    return DecentralizedFlow(scenario, seed).run(max_ticks)
