"""A flow node's link ends and the protocol that keeps both ends of every link consistent.

GWTF's flow nodes (gwtf.md §4.3) route units of flow hop by hop. ``LinkNode`` is the part of a
node that holds its inflow and outflow link ends and their costs, requests and accepts links,
propagates prefix and suffix costs, pushes back stale inflows, cancels dangling outflows, audits
the other ends, and forwards messages about link ends it handed to a peer. The annealing moves
build on it (``gwtf.moves``); a node's tick and churn repair complete it (``gwtf.algorithm``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from seedflood.pipeline.gwtf.messages import TO_DOWN, TO_UP, Kind, Mailbox, Message, UnitView

INF = math.inf
HOLDERS = -1  # the stage data holders sit at, before stage 0
STALE_TICKS = 8  # k: an unrouted inflow is pushed back, a dangling outflow cancelled, after k
AUDIT_PERIOD = 12  # ticks between a node's checks that the other end of each link exists
MAX_HOPS = 8  # forwarding pointers followed before a message about a link is dropped


@dataclass
class Inflow:
    """The down end of a link: a unit arriving from ``prev`` having cost ``prefix`` so far,
    passed on through outflow ``out`` (None: not yet), unrouted for ``age`` ticks."""

    prev: str | None
    prefix: float
    out: str | None = None
    age: int = 0


@dataclass
class Outflow:
    """The up end of a link: the unit from ``inflow`` (None: dangling for ``age`` ticks) goes
    to ``next`` and costs ``suffix`` from here to the end."""

    next: str
    suffix: float
    inflow: str | None
    age: int = 0


@dataclass
class Pending:
    """An unanswered request (for ``link``, to carry ``inflow``) or move proposal (a swap
    locks the up end of ``link``; a redirect ``reserves`` room for the unit it asks for)."""

    peer: str
    link: str = ""
    inflow: str = ""
    reserves: bool = False


@dataclass(frozen=True)
class Neighbours:
    """Who a node can talk to: the stages before and after it, and its own."""

    prev: tuple[str, ...]
    same: tuple[str, ...]
    next: tuple[str, ...]


class LinkNode:
    """A data holder (stage -1) or a relay, as far as its links go. It reads only its own links
    (``edges``), its flows and the costs the next stage advertised. ``proposal`` is its one
    unanswered move proposal: it reserves room, or locks a link's up end, so messages about that
    end wait in ``deferred`` until ``settle``."""

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
    ) -> None:
        self.name, self.stage, self.capacity, self.last = name, stage, capacity, last
        self.holder = stage == HOLDERS
        self.measure, self.mailbox, self.rng = measure, mailbox, rng
        self.prev, self.same, self.next = (
            list(neighbours.prev),
            list(neighbours.same),
            list(neighbours.next),
        )
        self.edges = {peer: measure(name, peer) for peer in (*self.prev, *self.next)}
        self.advertised: dict[str, float] = {}
        # A holder's inflows are its own microbatches: no previous node, nothing spent yet.
        own = range(capacity) if self.holder else range(0)
        self.inflows = {f"{name}:{k}": Inflow(None, 0.0) for k in own}
        self.outflows: dict[str, Outflow] = {}
        self.moved_in: dict[str, str] = {}
        self.moved_out: dict[str, str] = {}
        self.request: Pending | None = None
        self.proposal: Pending | None = None
        self.deferred: list[Message] = []
        self.cost_sent: float | None = None
        self.audit_offset = rng.randrange(AUDIT_PERIOD)
        self.serial = 0
        self.changed = False

    # --- what the node knows about itself ---------------------------------------------------

    def reserved(self) -> int:
        return int(self.proposal is not None and self.proposal.reserves)

    def spare(self) -> int:
        """Units it could still take: unrouted microbatches for a holder, room for a relay."""
        if self.holder:
            return sum(i.out is None for i in self.inflows.values()) - self.reserved()
        return self.capacity - max(len(self.inflows), len(self.outflows)) - self.reserved()

    def cost_to_end(self) -> float:
        """What one more unit through this relay would cost from here to the end."""
        if len(self.inflows) + self.reserved() >= self.capacity:
            return INF
        if self.last:
            return 0.0
        best = min((o.suffix for o in self.outflows.values() if o.inflow is None), default=INF)
        if len(self.outflows) < self.capacity:
            through = (self.edges[p] + self.advertised.get(p, INF) for p in self.next)
            best = min(best, min(through, default=INF))
        return best

    def suffix_of(self, inflow: Inflow) -> float | None:
        if self.last:
            return 0.0
        return None if inflow.out is None else self.outflows[inflow.out].suffix

    def view(self, link: str) -> UnitView | None:
        """The unit entering on ``link``, if it is routed all the way to the end."""
        inflow = self.inflows[link]
        head = inflow.prefix - self.edges[inflow.prev] if inflow.prev else 0.0
        if self.last:
            return UnitView(link, inflow.prev, head, inflow.prefix, None, None, 0.0, 0.0)
        if inflow.out is None:
            return None
        out = self.outflows[inflow.out]
        tail = out.suffix - self.edges[out.next]
        return UnitView(
            link, inflow.prev, head, inflow.prefix, inflow.out, out.next, tail, out.suffix
        )

    def units(self) -> list[UnitView]:
        return [v for link in self.inflows if (v := self.view(link)) is not None]

    # --- sending and bookkeeping -------------------------------------------------------------

    def send(self, kind: Kind, receiver: str, **fields: Any) -> None:
        self.mailbox.post(Message(kind, self.name, receiver, **fields))

    def send_prefix(self, link: str) -> None:
        inflow = self.inflows[link]
        if inflow.out is not None:
            out = self.outflows[inflow.out]
            self.send(
                Kind.PREFIX, out.next, link=inflow.out, cost=inflow.prefix + self.edges[out.next]
            )

    def send_suffix(self, link: str) -> None:
        inflow = self.inflows[link]
        suffix = self.suffix_of(inflow)
        if inflow.prev is not None and suffix is not None:
            self.send(Kind.SUFFIX, inflow.prev, link=link, cost=suffix)

    def pair(self, inflow: str, out: str) -> None:
        self.inflows[inflow].out = out
        self.outflows[out].inflow = inflow
        self.send_prefix(inflow)
        self.send_suffix(inflow)
        self.changed = True

    def drop_outflow(self, link: str) -> None:
        """The unit it carried is unrouted again and will be re-requested."""
        out = self.outflows.pop(link)
        if out.inflow in self.inflows:
            self.inflows[out.inflow].out = None
            self.inflows[out.inflow].age = 0
        self.changed = True

    def drop_inflow(self, link: str) -> None:
        """The outflow it fed is left dangling: offered to the next request, else cancelled."""
        inflow = self.inflows.pop(link)
        if inflow.out in self.outflows:
            self.outflows[inflow.out].inflow = None
            self.outflows[inflow.out].age = 0
        self.changed = True

    # --- each tick ---------------------------------------------------------------------------

    def advertise(self) -> None:
        """Tell the previous stage what one more unit through here costs, when that changed."""
        cost = self.cost_to_end()
        if cost != self.cost_sent:
            for peer in self.prev:
                self.send(Kind.ADVERT, peer, cost=cost)
            self.cost_sent = cost

    def audit(self, tick: int) -> None:
        """Every ``AUDIT_PERIOD`` ticks, ask the other end of each link whether it still exists."""
        if tick % AUDIT_PERIOD == self.audit_offset:
            for link, out in self.outflows.items():
                self.send(Kind.AUDIT_DOWN, out.next, link=link)
            for link, inflow in self.inflows.items():
                if inflow.prev is not None:
                    self.send(Kind.AUDIT_UP, inflow.prev, link=link)

    def request_unit(self) -> None:
        """Ask the cheapest next relay to carry the costliest unrouted unit."""
        unrouted = [link for link, i in self.inflows.items() if i.out is None]
        if self.holder:
            room = len(unrouted) - self.reserved()
        else:
            room = min(len(unrouted), self.capacity - len(self.outflows))
        if self.last or room <= 0:
            return
        options = ((self.edges[p] + self.advertised.get(p, INF), p) for p in self.next)
        cost, peer = min(options, default=(INF, ""))
        if cost == INF:
            return
        inflow = max(unrouted, key=lambda link: self.inflows[link].prefix)
        link = f"{self.name}#{self.serial}"
        self.serial += 1
        prefix = self.inflows[inflow].prefix + self.edges[peer]
        self.send(Kind.REQUEST, peer, link=link, cost=prefix, quote=self.advertised[peer])
        self.request = Pending(peer, link, inflow)

    def push_back_stale(self) -> None:
        if self.holder or self.last:
            return
        for link, inflow in list(self.inflows.items()):
            if inflow.out is None:
                inflow.age += 1
                if inflow.age > STALE_TICKS and inflow.prev is not None:
                    self.send(Kind.PUSH_BACK, inflow.prev, link=link)
                    self.drop_inflow(link)

    def cancel_dangling(self) -> None:
        for link, out in list(self.outflows.items()):
            if out.inflow is None:
                out.age += 1
                if out.age > STALE_TICKS:
                    self.send(Kind.CANCEL, out.next, link=link)
                    del self.outflows[link]
                    self.changed = True

    # --- receiving ---------------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        """Forward or answer a message about a link end not held here, else hand it to
        ``on_<kind>``; the handlers of the move kinds are a subclass's (``AnnealingNode``)."""
        kind, link = message.kind, message.link
        if kind in TO_UP and self.proposal is not None and self.proposal.link == link:
            # The peer asked to swap may already hold this link's up end: wait for its answer.
            self.deferred.append(message)
            return
        for ends, held, moved, audit, reply in (
            (TO_DOWN, self.inflows, self.moved_in, Kind.AUDIT_DOWN, Kind.DROP_OUT),
            (TO_UP, self.outflows, self.moved_out, Kind.AUDIT_UP, Kind.DROP_IN),
        ):
            if kind in ends and link not in held:
                if link in moved and message.hops < MAX_HOPS:
                    self.mailbox.post(replace(message, receiver=moved[link], hops=message.hops + 1))
                elif kind is audit:
                    self.send(reply, message.sender, link=link)
                return
        if kind not in (Kind.AUDIT_DOWN, Kind.AUDIT_UP):
            # An audited link that is held needs nothing: a disagreement over who holds its other
            # end is settled by the UP_IS/DOWN_IS claim already in flight.
            getattr(self, f"on_{kind.name.lower()}")(message)

    def on_advert(self, message: Message) -> None:
        if message.sender in self.next:
            self.advertised[message.sender] = message.cost

    def on_request(self, message: Message) -> None:
        if message.sender not in self.prev:
            return
        cost = self.cost_to_end()
        if cost == INF or cost != message.quote:
            self.send(Kind.REJECT, message.sender, link=message.link, cost=cost)
            return
        self.inflows[message.link] = Inflow(message.sender, message.cost)
        dangling = [link for link, o in self.outflows.items() if o.inflow is None]
        out = min(dangling, key=lambda link: self.outflows[link].suffix, default=None)
        suffix = self.outflows[out].suffix if out is not None and not self.last else cost
        self.send(Kind.ACCEPT, message.sender, link=message.link, cost=suffix)
        if out is not None and not self.last:
            self.pair(message.link, out)
        self.changed = True

    def on_accept(self, message: Message) -> None:
        asked = self.request if self.request and self.request.link == message.link else None
        if asked is not None:
            self.request = None
        link, peer = message.link, message.sender
        self.outflows[link] = Outflow(peer, self.edges[peer] + message.cost, None)
        unrouted = [name for name, i in self.inflows.items() if i.out is None]
        if asked is not None and asked.inflow in unrouted:
            self.pair(asked.inflow, link)
        elif unrouted:
            self.pair(max(unrouted, key=lambda name: self.inflows[name].prefix), link)
        self.changed = True

    def on_reject(self, message: Message) -> None:
        if self.request is not None and self.request.link == message.link:
            self.advertised[message.sender] = message.cost
            self.request = None

    def on_prefix(self, message: Message) -> None:
        inflow = self.inflows[message.link]
        if inflow.prev == message.sender and inflow.prefix != message.cost:
            inflow.prefix = message.cost
            self.send_prefix(message.link)
            self.changed = True

    def on_suffix(self, message: Message) -> None:
        out = self.outflows[message.link]
        suffix = self.edges.get(message.sender, INF) + message.cost
        if out.next == message.sender and out.suffix != suffix:
            out.suffix = suffix
            if out.inflow is not None:
                self.send_suffix(out.inflow)
            self.changed = True

    def on_up_is(self, message: Message) -> None:
        """``sender`` now holds the up end of this link; ``cost`` is our prefix through it, NaN
        if it has no unit for the link yet. A ``reply`` asks us to claim our end in turn."""
        if message.sender not in self.prev:
            self.drop_inflow(message.link)
            return
        inflow = self.inflows[message.link]
        inflow.prev = message.sender
        if not math.isnan(message.cost):
            inflow.prefix = message.cost
            self.send_prefix(message.link)
        if message.reply:
            suffix = self.suffix_of(inflow)
            cost = math.nan if suffix is None else suffix
            self.send(Kind.DOWN_IS, message.sender, link=message.link, cost=cost)
        self.changed = True

    def on_down_is(self, message: Message) -> None:
        """``sender`` now holds the down end of this link; as on_up_is, upstream."""
        if message.sender not in self.next:
            self.drop_outflow(message.link)
            return
        out = self.outflows[message.link]
        out.next = message.sender
        if not math.isnan(message.cost):
            out.suffix = self.edges[message.sender] + message.cost
            if out.inflow is not None:
                self.send_suffix(out.inflow)
        if message.reply:
            prefix = math.nan
            if out.inflow is not None:
                prefix = self.inflows[out.inflow].prefix + self.edges[out.next]
            self.send(Kind.UP_IS, out.next, link=message.link, cost=prefix)
        self.changed = True

    def on_push_back(self, message: Message) -> None:
        if self.outflows[message.link].next == message.sender:
            self.drop_outflow(message.link)

    def on_cancel(self, message: Message) -> None:
        if self.inflows[message.link].prev == message.sender:
            self.drop_inflow(message.link)

    def on_drop_in(self, message: Message) -> None:
        self.drop_inflow(message.link)

    def on_drop_out(self, message: Message) -> None:
        self.drop_outflow(message.link)

    def settle(self, peer: str) -> None:
        """The proposal to ``peer`` is answered: replay what waited on it."""
        if self.proposal is not None and self.proposal.peer == peer:
            self.proposal = None
            deferred, self.deferred = self.deferred, []
            for message in deferred:
                self.receive(message)
