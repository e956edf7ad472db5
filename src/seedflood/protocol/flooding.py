"""The flooding protocol as pure, deterministic state: one FloodState per client.

Flooding gives every client every message exactly once, at a cost independent of model size: a
client forwards a message the first time it sees it to every neighbour except the one it came
from, and drops duplicates. Keeping the protocol free of transport and model lets the simulator
and real peers share it, and lets tests check it hop by hop.

One refinement of the plain rule: when a neighbour sends a message this client already has, the
copy still owed to that neighbour is withdrawn, since the neighbour evidently has it. On a ring of
even size this makes every message cross exactly n directed edges instead of n + 1.

What a client has seen is kept per step as one integer bitmask over origins: with a thousand
clients and slow flooding a client holds hundreds of thousands of messages, which as sets of
Python ints would take gigabytes, and the simulator reads a client's holdings straight from here.
"""

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from seedflood.protocol.messages import Message

Deliveries = dict[int, list[tuple[int, list[Message]]]]
"""Per receiving client, the (sender, messages) packets one hop brought it, in arrival order."""

_CANONICAL = operator.attrgetter("key")


def origins(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first: the origins a per-step bitmask holds."""
    while mask:
        lowest = mask & -mask
        yield lowest.bit_length() - 1
        mask ^= lowest


class FloodState:
    """One client's flooding state: what it has seen and what it still owes each neighbour."""

    def __init__(self, me: int, neighbors: Sequence[int]) -> None:
        self.me = me
        self.neighbors: tuple[int, ...] = tuple(neighbors)
        if me in self.neighbors:
            raise ValueError(f"client {me} lists itself as a neighbour")
        if len(set(self.neighbors)) != len(self.neighbors):
            raise ValueError(f"client {me} lists a neighbour twice: {self.neighbors}")
        self.duplicates_dropped = 0
        self._seen_count = 0
        self._watermark = 0
        self._seen: dict[int, int] = {}
        self._owed: dict[int, dict[tuple[int, int], Message]] = {n: {} for n in self.neighbors}

    def has(self, key: tuple[int, int]) -> bool:
        """Whether (step, origin) was seen; every step below the forget watermark counts as seen."""
        step, origin = key
        return step < self._watermark or bool(self._seen.get(step, 0) >> origin & 1)

    def held(self, step: int) -> int:
        """The origins of ``step`` seen so far, as a bitmask (bit o set: origin o's message);
        0 for a step below the watermark, whose messages are no longer tracked."""
        return self._seen.get(step, 0)

    def _accept(self, message: Message, sender: int | None, forward: bool = True) -> None:
        step, origin = message.key
        self._seen[step] = self._seen.get(step, 0) | 1 << origin
        self._seen_count += 1
        for neighbor in self.neighbors if forward else ():
            if neighbor != sender:
                self._owed[neighbor][message.key] = message

    def originate(self, message: Message) -> None:
        """Start flooding one of this client's own updates."""
        if message.origin != self.me:
            raise ValueError(f"client {self.me} cannot originate a message of {message.origin}")
        if self.has(message.key):
            raise ValueError(f"message {message.key} was already seen by client {self.me}")
        self._accept(message, None)

    def receive(
        self, sender: int, messages: Iterable[Message], *, forward: bool = True
    ) -> list[Message]:
        """Accept a neighbour's packet; the new messages, canonically ordered, are to be applied.

        ``forward=False`` accepts without owing the messages to anyone: an anti-entropy repair,
        whose messages the other neighbours pull themselves if they lack them.
        """
        owed_back = self._owed.get(sender)
        if owed_back is None:
            raise ValueError(f"client {sender} is not a neighbour of client {self.me}")
        new: list[Message] = []
        for message in messages:
            if self.has(message.key):
                self.duplicates_dropped += 1
                owed_back.pop(message.key, None)
            else:
                self._accept(message, sender, forward)
                new.append(message)
        new.sort(key=_CANONICAL)
        return new

    def take_outbox(self) -> dict[int, list[Message]]:
        """Hand over what is owed, so each message is sent to each neighbour at most once."""
        outbox: dict[int, list[Message]] = {}
        for neighbor, owed in self._owed.items():
            if owed:
                outbox[neighbor] = sorted(owed.values(), key=_CANONICAL)
                self._owed[neighbor] = {}
        return outbox

    def withdraw(self, neighbor: int, keys: Iterable[tuple[int, int]]) -> None:
        """Drop owed copies that went to ``neighbor`` another way (an anti-entropy repair), so
        flooding does not send them a second time."""
        owed = self._owed[neighbor]
        for key in keys:
            owed.pop(key, None)

    @property
    def watermark(self) -> int:
        """Every step below this counts as seen (see forget_before)."""
        return self._watermark

    def tracked_steps(self) -> list[int]:
        """The steps at or above the watermark of which something was seen, ascending."""
        return sorted(self._seen)

    def forget_before(self, step: int) -> None:
        """Bound memory in long runs: steps below `step` are remembered only as a watermark.

        Call it only for steps that every client has surely received (for instance, older than
        the diameter in hops): a first arrival below the watermark is dropped as a duplicate.
        """
        if step <= self._watermark:
            return
        self._watermark = step
        for old in [s for s in self._seen if s < step]:
            del self._seen[old]

    @property
    def seen_count(self) -> int:
        """Distinct messages accepted so far, forgotten ones included: forgetting saves memory
        and must not change what the protocol reports."""
        return self._seen_count

    @property
    def retained_count(self) -> int:
        """Keys held in memory, to check that forget_before keeps long runs bounded."""
        return sum(origins.bit_count() for origins in self._seen.values())


class Transport(Protocol):
    """What `flood` needs from a transport, simulated or real. ``hosts_everyone`` says whether
    this process hosts every client, so that "nothing owed here" means "nothing owed anywhere"."""

    hosts_everyone: bool

    def hop(self, outboxes: Mapping[int, Mapping[int, Sequence[Message]]]) -> Deliveries: ...


def flood(states: Sequence[FloodState], network: Transport, hops: int) -> list[list[Message]]:
    """Run up to `hops` hops; per state (in the order given), the new messages it received.

    Where the transport hosts every client, stopping once nothing is owed keeps a round with k
    larger than needed from costing empty hops; real peers run every hop in lockstep.
    """
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    position = {state.me: index for index, state in enumerate(states)}
    if len(position) != len(states):
        raise ValueError("two flood states share one client id")
    received: list[list[Message]] = [[] for _ in states]
    for _ in range(hops):
        outboxes = {state.me: box for state in states if (box := state.take_outbox())}
        if not outboxes and network.hosts_everyone:
            break
        for receiver, packets in network.hop(outboxes).items():
            index = position.get(receiver)
            if index is None:
                raise ValueError(f"the transport delivered to client {receiver}, not hosted here")
            for sender, messages in packets:
                received[index].extend(states[index].receive(sender, messages))
    for messages in received:
        messages.sort(key=operator.attrgetter("key"))
    return received
