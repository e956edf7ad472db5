"""GWTF's improvement moves between same-stage flow nodes (gwtf.md §4.3), by simulated annealing.

Nodes of one stage share flow tables; from them a node finds a SWAP (exchange the downstream
parts of two units) or a REDIRECT (carry a peer's unit, having room) and proposes it. The node
asked accepts if the larger cost of the affected paths drops, else with probability exp(-Δ/T);
accepting cools T by ``cooling``, and below ``FROZEN`` × T0 only improvements pass, so runs end.
A move that leaves the larger cost as it was (mostly an exchange of identical downstream parts)
is never made: it would change nothing but the links' names.

When moves are made matters on long pipelines. A move is weighed on prefix and suffix
costs that travel one hop per tick, so with 12-16 stages and every node moving at will, most
moves were weighed while an earlier move's new costs were still on their way: they lowered
costs that no longer existed, undid each other, and runs did not settle in 3,000 ticks. So a
warm node moves at will (its moves explore anyway), but a frozen one only in its stage's window
of a sweep: holders first, then stage 0, 1, ..., ``MOVE_WINDOW`` ticks each, then ``stages``
idle ticks. A window's moves are answered within it; their new prefixes reach the next stage as
its window opens and every later stage before its own, and their new suffixes reach every
earlier stage before the sweep comes back to it. Once all are frozen, every move is thus weighed
on exact costs and lowers the sorted vector of path costs, so the descent ends. The temperature
also cools as a node's window opens, so that every node freezes within ``ANNEAL_SWEEPS`` sweeps
however rarely its moves are accepted.

Kept apart from the link protocol it builds on, which routes units without ever moving them.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

from seedflood.pipeline.flow import IMPROVEMENT
from seedflood.pipeline.gwtf.links import HOLDERS, Inflow, LinkNode, Neighbours, Outflow, Pending
from seedflood.pipeline.gwtf.messages import (
    Kind,
    Mailbox,
    Message,
    RedirectOffer,
    SwapOffer,
    Table,
    UnitView,
)

TABLE_PERIOD = 2  # least ticks between two flow tables sent to same-stage peers
EXPLORE_PROBABILITY = 0.5  # with none improving, it proposes a random move this often
FROZEN = 0.02  # below FROZEN * T0 a node accepts improvements only
MOVE_WINDOW = 6  # ticks each stage, holders first, has for its moves in a sweep
PROPOSE_TICKS = 4  # the window's first ticks, when proposals go out: the last is answered in it
ANNEAL_SWEEPS = 10  # sweeps in which the temperature falls from T0 to FROZEN * T0 by itself
WINDOW_COOLING = FROZEN ** (1 / ANNEAL_SWEEPS)


def sweep_ticks(stages: int) -> int:
    """Ticks of one sweep: a window per stage, holders first, then ``stages`` ticks for the last
    stage's cost changes to reach the holders before their next window."""
    return (stages + 1) * MOVE_WINDOW + stages


def swap_delta(u: UnitView, u_to_v_next: float, v: UnitView, v_to_u_next: float) -> float:
    """Change of the larger cost when u and v (same stage) exchange their downstream parts."""
    after = max(u.prefix + u_to_v_next + v.tail, v.prefix + v_to_u_next + u.tail)
    return after - max(u.cost, v.cost)


def redirect_delta(unit: UnitView, edge_prev: float, edge_next: float) -> float:
    """Change of a unit's cost when a same-stage peer, linked by these edges, carries it."""
    return unit.head + edge_prev + edge_next + unit.tail - unit.cost


class AnnealingNode(LinkNode):
    """A LinkNode that also improves its units' routing by moves with its same-stage peers,
    reading the tables they shared; ``temperature`` starts at ``t0``. Its move window needs no
    coordinator: ``stages`` is the pipeline's depth, which every node knows from how the model
    is split, and ticks are the rounds every node counts."""

    def __init__(
        self,
        name: str,
        stage: int,
        capacity: int,
        last: bool,
        neighbours: Neighbours,
        measure: Callable[[str, str], float],
        mailbox: Mailbox,
        rng: random.Random,
        t0: float,
        cooling: float,
        stages: int,
    ) -> None:
        super().__init__(name, stage, capacity, last, neighbours, measure, mailbox, rng)
        self.t0, self.temperature, self.cooling = t0, t0, cooling
        self.sweep = sweep_ticks(stages)
        self.tables: dict[str, Table] = {}
        self.table_sent: Table | None = None
        self.table_tick = -TABLE_PERIOD

    def anneal(self, delta: float) -> bool:
        """Accept a move that changes the larger cost by ``delta``. One that leaves it as it was
        is refused: it mostly exchanges identical downstream parts, and accepting it would
        only unsettle the paths' costs and cool the node without changing the routing."""
        if delta < -IMPROVEMENT:
            accepted = True
        elif delta <= IMPROVEMENT or self.temperature < FROZEN * self.t0:
            accepted = False
        else:
            accepted = self.rng.random() < math.exp(-delta / self.temperature)
        if accepted:
            self.temperature *= self.cooling
        return accepted

    def take_turn(self, tick: int) -> bool:
        """Whether this node may propose a move at ``tick``: at will while warm, once frozen in
        the first ``PROPOSE_TICKS`` of its stage's window. The temperature cools as it opens."""
        offset = tick % self.sweep - (self.stage - HOLDERS) * MOVE_WINDOW
        if offset == 0:
            self.temperature *= WINDOW_COOLING
        return self.temperature >= FROZEN * self.t0 or 0 <= offset < PROPOSE_TICKS

    def share_table(self, tick: int) -> None:
        if not self.same or tick - self.table_tick < TABLE_PERIOD:
            return
        table = Table(self.spare(), tuple(self.units()), tuple(sorted(self.edges.items())))
        if table != self.table_sent:
            for peer in self.same:
                self.send(Kind.TABLE, peer, table=table)
            self.table_sent, self.table_tick = table, tick

    def try_move(self) -> None:
        """Propose the move that lowers the costlier affected path most; failing that, while
        still warm, sometimes a random one, which the peer accepts by annealing."""
        units = self.units()
        moves: list[tuple[float, str, SwapOffer | RedirectOffer | tuple[UnitView, UnitView]]] = []
        if not self.last:
            for u, w in itertools.combinations(units, 2):
                if u.next is not None and w.next is not None and not self.holder:
                    delta = swap_delta(u, self.edges[w.next], w, self.edges[u.next])
                    moves.append((delta, self.name, (u, w)))
            for peer, table in self.tables.items():
                theirs = dict(table.edges)
                for v, u in itertools.product(table.units, units):
                    if v.next in self.edges and u.next in theirs:
                        to_v_next = self.edges[v.next]
                        delta = swap_delta(u, to_v_next, v, theirs[u.next])
                        moves.append((delta, peer, SwapOffer(u, v, to_v_next)))
        if self.spare() > 0:
            for peer, table in self.tables.items():
                for v in table.units:
                    ends = [e for e in (v.prev, v.next) if e is not None]
                    if all(e in self.edges for e in ends):
                        edge_prev = self.edges[v.prev] if v.prev else 0.0
                        edge_next = self.edges[v.next] if v.next else 0.0
                        offer = RedirectOffer(v, edge_prev, edge_next)
                        moves.append((redirect_delta(v, edge_prev, edge_next), peer, offer))
        moves = [m for m in moves if abs(m[0]) > IMPROVEMENT]
        if not moves:
            return
        move = min(moves, key=lambda m: m[0])
        if move[0] >= -IMPROVEMENT:
            if self.temperature < FROZEN * self.t0 or self.rng.random() >= EXPLORE_PROBABILITY:
                return
            move = self.rng.choice(moves)
        delta, peer, offer = move
        if isinstance(offer, SwapOffer):
            self.send(Kind.PROPOSE_SWAP, peer, swap=offer)
            self.proposal = Pending(peer, link=offer.mine.out or "")
        elif isinstance(offer, RedirectOffer):
            self.send(Kind.PROPOSE_REDIRECT, peer, redirect=offer)
            self.proposal = Pending(peer, reserves=True)
        elif self.anneal(delta):
            self.swap_here(*offer)

    def swap_here(self, u: UnitView, w: UnitView) -> None:
        assert u.out is not None and w.out is not None
        self.pair(u.inflow, w.out)
        self.pair(w.inflow, u.out)

    def on_table(self, message: Message) -> None:
        if message.sender in self.same and message.table is not None:
            self.tables[message.sender] = message.table

    def on_propose_swap(self, message: Message) -> None:
        offer = message.swap
        assert offer is not None
        mine = self.view(offer.theirs.inflow) if offer.theirs.inflow in self.inflows else None
        u = offer.mine
        if (
            self.proposal is not None
            or mine is None
            or mine != offer.theirs
            or u.next not in self.edges
            or not self.anneal(swap_delta(u, offer.edge_to_their_next, mine, self.edges[u.next]))
        ):
            self.send(Kind.REJECT_MOVE, message.sender)
            return
        assert mine.out is not None and u.out is not None and u.next is not None
        del self.outflows[mine.out]
        self.moved_out[mine.out] = message.sender
        self.moved_out.pop(u.out, None)
        self.outflows[u.out] = Outflow(u.next, self.edges[u.next] + u.tail, mine.inflow)
        self.inflows[mine.inflow].out = u.out
        self.send(Kind.ACCEPT_SWAP, message.sender, swap=offer, unit=mine)
        cost = mine.prefix + self.edges[u.next]
        self.send(Kind.UP_IS, u.next, link=u.out, cost=cost, reply=True)
        self.send_suffix(mine.inflow)
        self.changed = True

    def on_accept_swap(self, message: Message) -> None:
        assert message.swap is not None and message.unit is not None
        u, theirs = message.swap.mine, message.unit
        assert u.out is not None and theirs.out is not None and theirs.next is not None
        self.temperature *= self.cooling
        if u.out in self.outflows:
            self.drop_outflow(u.out)
        self.moved_out[u.out] = message.sender
        self.moved_out.pop(theirs.out, None)
        if theirs.next in self.edges:
            edge = self.edges[theirs.next]
            self.outflows[theirs.out] = Outflow(theirs.next, edge + theirs.tail, None)
            inflow = self.inflows.get(u.inflow)
            prefix = math.nan if inflow is None else inflow.prefix + edge
            self.send(Kind.UP_IS, theirs.next, link=theirs.out, cost=prefix, reply=True)
            if inflow is not None and inflow.out is None:
                self.pair(u.inflow, theirs.out)
        self.settle(message.sender)

    def on_propose_redirect(self, message: Message) -> None:
        offer = message.redirect
        assert offer is not None
        unit = self.view(offer.unit.inflow) if offer.unit.inflow in self.inflows else None
        if (
            self.proposal is not None
            or unit is None
            or unit != offer.unit
            or not self.anneal(redirect_delta(unit, offer.edge_prev, offer.edge_next))
        ):
            self.send(Kind.REJECT_MOVE, message.sender)
            return
        if self.holder:
            self.inflows[unit.inflow].out = None
        else:
            del self.inflows[unit.inflow]
            self.moved_in[unit.inflow] = message.sender
        if unit.out is not None:
            del self.outflows[unit.out]
            self.moved_out[unit.out] = message.sender
        self.send(Kind.ACCEPT_REDIRECT, message.sender, unit=unit)
        self.changed = True

    def on_accept_redirect(self, message: Message) -> None:
        unit = message.unit
        assert unit is not None
        self.settle(message.sender)
        self.temperature *= self.cooling
        self.moved_in.pop(unit.inflow, None)
        if unit.out is not None:
            self.moved_out.pop(unit.out, None)
        inflow: str | None = unit.inflow
        if self.holder:
            inflow = next((k for k, i in self.inflows.items() if i.out is None), None)
        ends = [e for e in (unit.prev, unit.next) if e is not None]
        if inflow is None or not all(e in self.edges for e in ends):
            # A neighbour of the unit died meanwhile: let the live ends release it.
            if unit.prev in self.edges:
                self.send(Kind.DROP_OUT, unit.prev, link=unit.inflow)
            if unit.out is not None and unit.next in self.edges:
                self.send(Kind.DROP_IN, unit.next, link=unit.out)
            return
        if unit.prev is not None:
            self.inflows[inflow] = Inflow(unit.prev, unit.head + self.edges[unit.prev])
        if unit.out is not None and unit.next is not None:
            edge = self.edges[unit.next]
            self.outflows[unit.out] = Outflow(unit.next, edge + unit.tail, inflow)
            self.inflows[inflow].out = unit.out
            prefix = self.inflows[inflow].prefix + edge
            self.send(Kind.UP_IS, unit.next, link=unit.out, cost=prefix, reply=True)
        if unit.prev is not None:
            suffix = self.suffix_of(self.inflows[inflow])
            cost = math.nan if suffix is None else suffix
            self.send(Kind.DOWN_IS, unit.prev, link=inflow, cost=cost, reply=True)
        self.changed = True

    def on_reject_move(self, message: Message) -> None:
        self.settle(message.sender)
