"""How a peer waits for the run: it commits what arrives, pulls after a few typical round times
without progress, has members that stall the run removed by quorum after longer, and leaves once
the quorum removed it and it made every message it owes. Kept apart from `seedflood.peers.node`
so the loop there reads on its own; `Waiting` is part of its `Node`, whose attributes it uses.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from seedflood.peers.options import PeerError, PeerOptions, Say
from seedflood.peers.quorum import DECIDE_PROTOCOL

if TYPE_CHECKING:
    from seedflood.peers.batch_exchange import Exchange
    from seedflood.peers.inbox import Door
    from seedflood.peers.p2p import Link
    from seedflood.peers.quorum import Quorum
    from seedflood.peers.removals import Removal
    from seedflood.peers.seats import Seating
    from seedflood.peers.state import PeerState

__all__ = ["RoundClock", "Waiting", "removed_error"]


class RoundClock:
    """Typical round time, for timeouts that follow the run's real pace."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self.durations: list[float] = []

    def add(self, seconds: float) -> None:
        self.durations = [*self.durations[-19:], seconds]

    def typical(self) -> float:
        return max(self.floor, statistics.median(self.durations) if self.durations else 0.0)


class Waiting:
    """The waits of a `seedflood.peers.node.Node`, which is one. One lock (``cond``) guards the
    state and what seating and exchange keep."""

    options: PeerOptions
    say: Say
    state: PeerState
    cond: threading.Condition
    clock: RoundClock
    door: Door
    quorum: Quorum
    exchange: Exchange
    link: Link
    seating: Seating
    local_steps: int
    longest_stall: float
    last_removal: float
    made_messages: bool

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Commit what arrives until ``ready``; pull after a few round times without progress,
        and have members that stall the run removed by quorum after longer. Each commit may
        settle batches that waited at the door for their origin's admission."""
        since = last_pull = last_note = time.monotonic()
        while True:
            with self.cond:
                before = self.state.committed_step
                if self.state.commit():
                    self.longest_stall = max(self.longest_stall, time.monotonic() - since)
                    since = last_pull = time.monotonic()
                    if self.state.members.last_step_passed(before, self.state.committed_step):
                        self.seating.rewire()
                self.quorum.stalled_since = since
                caught = self.quorum.evidence_pending()
                settled = self.exchange.settled() if self.door.waiting else []
                targets = dict(self.seating.neighbors)
                finished = ready() or self.state.tripped is not None
                removed = self._owes_nothing()
                if not finished and not settled and not caught and not removed:
                    self.cond.wait(0.05)
            if removed:
                self._leave()
            if settled:
                self.exchange.push(targets, settled, [])
            if caught:  # an equivocator is removed at once, not after a stall
                self._remove_stalling(time.monotonic())
            if finished:
                return
            now, typical = time.monotonic(), self.clock.typical()
            if now - last_pull > 3 * typical:
                self.exchange.pull(self.seating.others())
                last_pull = time.monotonic()
            with self.cond:
                self.quorum.patience = max(
                    self.options.silent_rounds * typical,
                    3 * self.options.ttl,
                    self.options.patience,
                )
            if now - self.last_removal > max(typical, 1.0):  # across waits: retries go on
                self._remove_stalling(now)
                self.last_removal = time.monotonic()
            if now - last_note > 30:
                with self.cond:
                    missing = self.state.missing()
                self.say(
                    f"waiting for {what}: step {self.state.committed_step + 1} lacks {missing}"
                )
                last_note = now

    def _next_round(self) -> int:
        """The first round whose messages this client has not made yet."""
        seat = self.state.members.seats[self.state.me]
        return max(self.state.own_rounds_done(), self.state.round_of(seat.first_step))

    def _owes_nothing(self) -> bool:
        """Whether the quorum removed this client and it made every message before the step
        its removal starts at: up to that step it is still a member, and makes and serves its
        messages."""
        removal = self.quorum.removal_of_me()
        return removal is not None and self._next_round() * self.local_steps >= removal.from_step

    def _leave(self) -> None:
        """Stop a client whose seat the quorum closed, once it made every message it owes. One
        that made messages in this process first serves the others until they finish (its
        last ones reach them by their pulls: they no longer hear its pushes); one restarted
        after its removal owes nothing and stops at once."""
        if self.made_messages:
            self.seating.finish()
            self._linger()
        removal = self.quorum.removal_of_me()
        assert removal is not None
        raise removed_error(self.state.me, removal.from_step, self.options, removal)

    def _remove_stalling(self, now: float) -> None:
        """Propose removing the members this peer has waited on too long (after one more pull,
        so that a removal cuts off no message someone still holds) and the members this peer
        caught equivocating, and gather co-signatures for the removals still open; flood the
        ones a majority decided, and pull again after releasing one that no majority can sign."""
        with self.cond:
            self.quorum.propose_equivocators()
            due = self.quorum.should_propose(now)
        if due:
            self.exchange.pull(self.seating.others())
            with self.cond:
                if self.quorum.should_propose(now):
                    self.quorum.propose()
        with self.cond:
            open_removals = list(self.quorum.open.values())
            released = self.quorum.counts["removal_released"]
        decided = []
        for removal in open_removals:
            done = self.quorum.gather(
                removal, lambda peer, data: self.link.request(peer, DECIDE_PROTOCOL, data)
            )
            if done is not None:
                decided.append(done)
        with self.cond:
            released = self.quorum.counts["removal_released"] > released
            if decided or released:
                self.seating.rewire()
                targets = dict(self.seating.neighbors)
                self.cond.notify_all()
        if released:  # the member is back: fetch what the promise dropped
            self.exchange.pull(self.seating.others())
        if decided:
            self.exchange.push(targets, [], decided)

    def _linger(self) -> None:
        """Keep serving until every live member has finished too: a neighbour that restarted or
        joined late may still need this peer's messages. A member the quorum removed needs
        none (its seat is closed), so it is not waited for: a silent or hostile one never
        finishes, and would hold every honest peer for the whole linger."""
        deadline = time.monotonic() + self.options.linger
        while time.monotonic() < deadline:
            with self.cond:
                self.state.commit()
                removed = {
                    i for i, seat in self.state.members.seats.items() if seat.gone_from is not None
                }
            members = self.seating.membership.members()
            if all(m.done for m in members if m.index >= 0 and m.index not in removed):
                return
            time.sleep(0.2)
        self.say(f"stopped waiting for the other peers to finish after {self.options.linger:g} s")


def removed_error(
    me: int, from_step: int, options: PeerOptions, removal: Removal | None = None
) -> PeerError:
    """Why a peer whose seat the quorum closed stops, and what its operator can do; without
    the ``removal`` itself (a restart that finds only its departure on disk), why is unknown."""
    if removal is None:
        why = "a majority of the other members signed its removal"
    elif removal.evidence is not None:
        why = (
            f"it signed two versions of its batch of round {removal.evidence.round}, and a "
            "majority of the other members signed its removal"
        )
    else:
        why = (
            "the other members waited for its messages longer than they wait for a silent "
            "member (--patience), and a majority of them signed its removal"
        )
    return PeerError(
        f"client {me} was removed from the run from step {from_step}: {why}. Start it with a "
        f"new state dir (not {options.state_dir}) to join the run again"
    )
