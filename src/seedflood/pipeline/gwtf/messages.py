"""The vocabulary GWTF's flow nodes speak (gwtf.md §4.3): message kinds, which end of a link
each kind is addressed to, the unit views, tables and move offers messages carry, and the
in-process mailbox that delivers them. Kept apart so that the protocol and the moves share one
definition of what travels between nodes, and nothing else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """Message kinds; the prototype's CHANGE is ADVERT, QUERY_FLOWS is TABLE, NOTIFY_SWITCH
    and NOTIFY_CHANGE_IN_COST are UP_IS/DOWN_IS and PREFIX/SUFFIX, CHECK_FLOW is AUDIT."""

    ADVERT = enum.auto()
    REQUEST = enum.auto()
    ACCEPT = enum.auto()
    REJECT = enum.auto()
    PREFIX = enum.auto()
    SUFFIX = enum.auto()
    UP_IS = enum.auto()
    DOWN_IS = enum.auto()
    PUSH_BACK = enum.auto()
    CANCEL = enum.auto()
    AUDIT_DOWN = enum.auto()
    AUDIT_UP = enum.auto()
    DROP_IN = enum.auto()
    DROP_OUT = enum.auto()
    TABLE = enum.auto()
    PROPOSE_SWAP = enum.auto()
    PROPOSE_REDIRECT = enum.auto()
    ACCEPT_SWAP = enum.auto()
    ACCEPT_REDIRECT = enum.auto()
    REJECT_MOVE = enum.auto()


# Messages about a link go to the node holding its down end (TO_DOWN) or its up end (TO_UP).
TO_DOWN = frozenset({Kind.PREFIX, Kind.UP_IS, Kind.CANCEL, Kind.AUDIT_DOWN, Kind.DROP_IN})
TO_UP = frozenset({Kind.SUFFIX, Kind.DOWN_IS, Kind.PUSH_BACK, Kind.AUDIT_UP, Kind.DROP_OUT})


@dataclass(frozen=True)
class UnitView:
    """A unit as its carrier sees it. head: cost up to the previous node; tail: cost beyond the
    next one. A holder's unit has no ``prev``, a last-stage unit no ``out``/``next``."""

    inflow: str
    prev: str | None
    head: float
    prefix: float
    out: str | None
    next: str | None
    tail: float
    suffix: float

    @property
    def cost(self) -> float:
        return self.prefix + self.suffix


@dataclass(frozen=True)
class Table:
    """What a node shares with its same-stage peers so they can find moves."""

    spare: int
    units: tuple[UnitView, ...]
    edges: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class SwapOffer:
    """Proposer's unit ``mine`` for the receiver's unit ``theirs`` as its table showed it, whose
    next hop the proposer reaches at ``edge_to_their_next``. The receiver refuses if ``theirs``
    changed since: the proposer weighed the swap on those costs."""

    mine: UnitView
    theirs: UnitView
    edge_to_their_next: float


@dataclass(frozen=True)
class RedirectOffer:
    """The proposer, which has room, asks to carry the receiver's ``unit`` (as its table showed
    it), reaching the unit's previous and next nodes at ``edge_prev`` and ``edge_next``."""

    unit: UnitView
    edge_prev: float
    edge_next: float


@dataclass(frozen=True)
class Message:
    """One type for every kind; a kind leaves the fields it does not use at their defaults.
    ``cost`` is the cost-to-end (ADVERT, REJECT, ACCEPT), the prefix (REQUEST, PREFIX, UP_IS)
    or the suffix (SUFFIX, DOWN_IS) it reports; ``quote`` is the cost a REQUEST believed."""

    kind: Kind
    sender: str
    receiver: str
    link: str = ""
    cost: float = 0.0
    quote: float = 0.0
    table: Table | None = None
    swap: SwapOffer | None = None
    redirect: RedirectOffer | None = None
    unit: UnitView | None = None
    reply: bool = False
    hops: int = 0


class Mailbox:
    """In-process network: what is posted during a tick is delivered, in order, the next."""

    def __init__(self) -> None:
        self._queue: list[Message] = []
        self.sent = 0

    def post(self, message: Message) -> None:
        self._queue.append(message)
        self.sent += 1

    def collect(self) -> list[Message]:
        due, self._queue = self._queue, []
        return due

    def drop(self, name: str) -> None:
        """A crashed node neither receives nor finishes sending."""
        self._queue = [m for m in self._queue if name not in (m.sender, m.receiver)]
