"""Removing a member that stalls the run, by a signed majority of the others.

A step commits only once every expected member's message is in, so one member that stops
sending (it crashed, left, was banned for a forgery or an equivocation, or just went silent while
renewing its DHT record) would stall every peer forever. After ``patience`` seconds without a
commit, the lowest-indexed member that is not itself missing proposes to remove the missing ones
from the step after their last message it holds (`Removal`, signed), and asks every other member
expected at that step to sign it too. A member signs only what its own view supports: it holds
no message of the removed client at or after that step, and it has waited for that client
itself (half the patience), or banned it, or no longer sees it in the DHT. Signing is a promise:
the signer takes the removal into its own state at once, so it will never commit a message the
removal cuts off. Once a majority of the members expected at the step (the removed one aside)
have signed, the removal is decided: it is flooded with the batches, and every peer checks the
signatures against its own member table before it takes it.

An equivocator is not waited for: any peer that holds two signed versions of one of its rounds
proposes its removal at once, with that evidence, from a step fixed by the evidence alone
(`equivocation_step`), so that every peer that saw the offence proposes the same decision, and
far enough ahead that no honest member has committed it yet. A member signs it when the evidence
verifies under the equivocator's key, whatever it holds of the equivocator: it drops those
messages from that step on. Versions of the rounds before that step are committed as each peer
received them first: where two honest peers took different ones, their hash claims say so.
An equivocator that then falls silent before that step is removed again, as any silent member,
from the earlier step its silence starts at: an earlier removal supersedes a later one.

A promise that no majority can ever sign is released. An honest member never signs a removal
of a step it has committed, so once more voters say they committed the step than a majority
can spare, the removal cannot be decided: each of its signers (the proposer, and every
co-signer, which keeps asking too) takes the member back from that step, pulls what the promise
dropped, and goes on. Without this, a member that was only slow (its message reached the others
just after the proposer's last pull) would leave its removal's signers stalled for good.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from seedflood.peers.inbox import window_rounds
from seedflood.peers.p2p import Frame, TransportError
from seedflood.peers.removals import Equivocation, Removal, quorum, read_removals

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from seedflood.peers.crypto import Context
    from seedflood.peers.inbox import Door
    from seedflood.peers.options import Say
    from seedflood.peers.state import PeerState

__all__ = ["DECIDE_PROTOCOL", "Quorum", "equivocation_step"]

DECIDE_PROTOCOL = "seedflood/decide/1"
COMMITTED = "step already committed"
"""The one refusal that is for good: an honest member never uncommits a step."""


def equivocation_step(evidence: Equivocation, local_steps: int, staleness: int) -> int:
    """The step an equivocator is removed from: two windows past the round it equivocated in.
    Any honest peer holding a batch of that round had it within its window, so had not then
    committed past the round's window end; two windows leave the removal time to be decided."""
    return (evidence.round + 2 * window_rounds(staleness)) * local_steps


class Quorum:
    """This peer's part in removals: proposing, co-signing, and taking decided ones. Every
    method that reads the state takes ``cond`` itself; none holds it across a network call."""

    def __init__(
        self,
        *,
        cond: threading.Condition,
        state: PeerState,
        door: Door,
        context: Context,
        signing_key: Ed25519PrivateKey,
        say: Say,
        live_ids: Callable[[], set[str]],
    ) -> None:
        self.cond, self.state, self.door = cond, state, door
        self.context, self.signing_key, self.say = context, signing_key, say
        self.live_ids = live_ids
        self.decided: dict[int, Removal] = {}
        self.open: dict[int, Removal] = {}
        self.stale_evidence: set[int] = set()
        # Removals this peer promised (proposed or co-signed) and has not seen decided: their
        # members still vote and sign, since a promise is not a decision.
        self.promised: set[int] = set()
        # What each promise, by (client, step), replaced: the seat's departure and the open
        # promise before it, restored if no majority can ever sign it.
        self.before: dict[tuple[int, int], tuple[int | None, int | None]] = {}
        self.counts: Counter[str] = Counter()
        # A restarted peer knows its departures (members.json) but not the decisions behind
        # them, which only the others' replies bring back: until then each counts as undecided.
        self.state.undecided.update(
            (i, seat.gone_from)
            for i, seat in state.members.seats.items()
            if seat.gone_from is not None
        )
        self.stalled_since = time.monotonic()
        self.patience = float("inf")

    # -- what every peer checks ---------------------------------------------------------------

    def _key_of(self, index: int) -> str | None:
        seat = self.state.members.seats.get(index)
        if seat is None or (seat.gone_from is not None and index not in self.promised):
            return None
        return seat.key

    def _voters(self, removal: Removal) -> list[int]:
        """The members expected at the removal's step, the removed one aside, by decisions
        alone: this peer's own promises do not shrink the electorate, or one proposer that
        promised several removals at once would make each need only its own signature."""
        step = removal.from_step
        return [
            i
            for i, seat in sorted(self.state.members.seats.items())
            if i != removal.index
            and (seat.expected_at(step) or (i in self.promised and seat.first_step <= step))
        ]

    def _promise(self, index: int, from_step: int) -> None:
        """Take ``index`` as gone from ``from_step`` before the removal is decided: this peer
        never commits a message the removal would cut off, nor a step from there on until the
        removal is decided. A removal decided here already is no promise: nothing would
        clear it."""
        if self._superseded(index, from_step):
            return
        seat = self.state.members.seats[index]
        prior = (seat.gone_from, self.state.undecided.get(index))
        self.before.setdefault((index, from_step), prior)
        self.state.depart(index, from_step)
        self.state.undecided[index] = from_step
        self.promised.add(index)

    def _superseded(self, index: int, from_step: int) -> bool:
        """Whether a removal of ``index`` from ``from_step`` or earlier is decided here: an
        earlier removal supersedes a later one, never the reverse."""
        known = self.decided.get(index)
        return known is not None and known.from_step <= from_step

    def _is_decided(self, removal: Removal) -> bool:
        return removal.decided(self.context, self._key_of, self._voters(removal))

    def take(self, removals: list[Removal]) -> list[Removal]:
        """Apply the decided removals among ``removals`` (from a frame); the ones that were
        news, to flood on. Call under the lock."""
        news = []
        for removal in removals:
            if self._superseded(removal.index, removal.from_step):
                continue
            if not self._is_decided(removal):
                self.counts["undecided_removal"] += 1
                continue
            self.decided[removal.index] = removal
            self.before.pop((removal.index, removal.from_step), None)  # never to be released
            held = self.open.get(removal.index)
            if held is not None and held.from_step >= removal.from_step:
                del self.open[removal.index]  # decided, or superseded: nothing left to ask
            if removal.index == self.state.me:  # the node stops: its state no longer matters
                self.say(f"this client was removed from step {removal.from_step} by quorum")
                continue
            self.promised.discard(removal.index)
            if self.state.undecided.get(removal.index) == removal.from_step:
                del self.state.undecided[removal.index]  # a promise of another step stays open
            self.state.depart(removal.index, removal.from_step)
            self.say(f"client {removal.index} removed from step {removal.from_step} by quorum")
            news.append(removal)
        return news

    def removal_of_me(self) -> Removal | None:
        """The decided removal of this peer's own seat, once it heard of it."""
        return self.decided.get(self.state.me)

    def record(self) -> dict[str, Any]:
        """What results.json says of removals: each decided one with its signers, the wire
        bytes of the decisions, and what was refused or fell short."""
        with self.cond:
            decided = [
                {
                    "client": r.index,
                    "from_step": r.from_step,
                    "signers": sorted(r.signers(self.context, self._key_of)),
                    "wire_bytes": len(json.dumps(r.to_wire(), separators=(",", ":"))),
                    "evidence_round": r.evidence.round if r.evidence else None,
                }
                for r in self.decided.values()
            ]
            return {"decided": decided, **dict(self.counts)}

    def known(self) -> list[Removal]:
        """Every decided removal, for a peer that asks what it missed. Call under the lock."""
        return list(self.decided.values())

    # -- co-signing ---------------------------------------------------------------------------

    def _support(self, removal: Removal, now: float) -> str:
        """Why this peer cannot sign ``removal`` ("" when it can). Call under the lock."""
        state, index = self.state, removal.index
        seat = state.members.seats.get(index)
        if seat is None:
            return "not a member"
        if seat.gone_from == removal.from_step:  # promised already: signed again
            return ""
        if seat.gone_from is not None and (
            seat.gone_from < removal.from_step or removal.evidence is not None
        ):
            return "removed from another step"
        if removal.from_step <= state.committed_step:
            return COMMITTED
        if removal.evidence is not None:
            return self._evidence_support(removal, removal.evidence, seat.key)
        if any(index in held for step, held in state.pending.items() if step >= removal.from_step):
            return "holds its message"
        if index not in state.missing():
            return "not waiting for it"
        waited = now - self.stalled_since >= self.patience / 2
        if not (waited or seat.peer_id in self.door.banned or seat.peer_id not in self.live_ids()):
            return "has not waited long enough"
        return ""

    def _evidence_support(self, removal: Removal, evidence: Equivocation, key: str) -> str:
        """Why the evidence does not justify ``removal`` ("" when it does); when it does, this
        peer keeps the evidence too."""
        if evidence.origin != removal.index or not evidence.proves(self.context, key):
            self.counts["false_evidence"] += 1
            return "the evidence proves no equivocation"
        state = self.state
        if removal.from_step != equivocation_step(evidence, state.local_steps, state.staleness):
            return "not the step the evidence fixes"
        self.door.equivocations.setdefault(removal.index, evidence)
        return ""

    def on_decide(self, caller: str, data: bytes) -> bytes:
        """Co-sign a proposed removal that this peer's own view supports."""
        header = Frame.decode(data).header
        removals, bad = read_removals([header["removal"]] if "removal" in header else None)
        if bad or len(removals) != 1:
            self.counts["malformed_removal"] += 1
            raise TransportError(f"{caller} sent a malformed removal")
        removal = removals[0]
        with self.cond:
            proposers = removal.signers(self.context, self._key_of)
            callers = {i for i, seat in self.state.members.seats.items() if seat.peer_id == caller}
            if not proposers & callers:
                self.counts["unsigned_proposal"] += 1
                return Frame({"refused": "not proposed by the caller"}).encode()
            known = self.decided.get(removal.index)
            if known is not None and known.from_step == removal.from_step:
                # decided here already: the decision answers, and a promise now would hold
                # this peer's commits back for good, since no decision comes to clear it
                return Frame({"removal": known.to_wire()}).encode()
            reason = self._support(removal, time.monotonic())
            if reason:
                return Frame({"refused": reason}).encode()
            signed = removal.signed(self.signing_key, self.context, self.state.me)
            self._promise(removal.index, removal.from_step)
            held = self.open.get(removal.index)
            if held is None or held.from_step > removal.from_step:
                self.open[removal.index] = signed  # a co-signer asks too, to decide or release
            elif held.from_step == removal.from_step:
                self.open[removal.index] = held.merged(signed)
            self.cond.notify_all()
        self.say(f"signed the removal of client {removal.index} from step {removal.from_step}")
        return Frame({"removal": signed.to_wire()}).encode()

    # -- proposing ----------------------------------------------------------------------------

    def should_propose(self, now: float) -> bool:
        """Whether this peer proposes now: it waited ``patience`` for the members missing at
        its next step, and it is the lowest-indexed member not missing. Call under the lock."""
        state = self.state
        missing = set(state.missing())
        present = [i for i in state.members.expected(state.committed_step + 1) if i not in missing]
        return (
            now - self.stalled_since >= self.patience
            and bool(missing)
            and bool(present)
            and min(present) == state.me
        )

    def propose(self) -> None:
        """Sign the removal of every member missing at the next step, from the step after its
        last message held here, and promise it (take it into this peer's state). Call under
        the lock, after pulling what the others hold."""
        state = self.state
        for index in state.missing():
            removal = Removal(index, state.last_step_of(index) + 1)
            self.open[index] = removal.signed(self.signing_key, self.context, state.me)
            self._promise(index, removal.from_step)
            self.say(f"proposing to remove client {index} from step {removal.from_step}")

    def evidence_pending(self) -> bool:
        """Whether this peer holds evidence against a member it has not yet proposed to remove
        (nor found too late). Call under the lock."""
        seats = self.state.members.seats
        return any(
            i in seats and seats[i].gone_from is None and i not in self.stale_evidence
            for i in self.door.equivocations
        )

    def propose_equivocators(self) -> None:
        """Sign and promise the removal of each member this peer holds evidence against, from
        the step the evidence fixes; evidence that comes too late (that step is committed here)
        is counted and left to the hash claims. Call under the lock."""
        state = self.state
        for index, evidence in self.door.equivocations.items():
            seat = state.members.seats.get(index)
            if seat is None or seat.gone_from is not None or index in self.stale_evidence:
                continue  # unknown, already removed (or promised), or too late
            from_step = equivocation_step(evidence, state.local_steps, state.staleness)
            if from_step <= state.committed_step:
                self.stale_evidence.add(index)
                self.counts["stale_evidence"] += 1
                continue
            removal = Removal(index, from_step, evidence=evidence)
            self.open[index] = removal.signed(self.signing_key, self.context, state.me)
            self._promise(index, from_step)
            self.say(
                f"proposing to remove client {index} from step {from_step}: it equivocated in "
                f"round {evidence.round}"
            )

    def gather(self, removal: Removal, ask: Callable[[str, bytes], bytes | None]) -> Removal | None:
        """Ask the other voters to co-sign ``removal`` until a majority has; the decided
        removal, or None when too few agreed this time, or never can (then this peer's
        promise of it is released, and counted as ``removal_released``)."""
        with self.cond:
            voters = [
                (i, self.state.members.seats[i].peer_id)
                for i in self._voters(removal)
                if i != self.state.me
            ]
        request = Frame({"removal": removal.to_wire()}).encode()
        committed: set[int] = set()
        for voter, peer_id in voters:
            with self.cond:
                if self._is_decided(removal):
                    break
            signed, refusal = self._read_reply(ask(peer_id, request), removal)
            if signed is not None:
                removal = removal.merged(signed)
            elif refusal == COMMITTED:
                committed.add(voter)
        with self.cond:
            if not self._is_decided(removal):
                electorate = self._voters(removal)
                if len(committed & set(electorate)) > len(electorate) - quorum(len(electorate)):
                    self._release(removal, len(committed))
                    return None
                held = self.open.get(removal.index, removal)
                superseded = self._superseded(removal.index, removal.from_step)
                if not superseded and held.from_step == removal.from_step:
                    self.open[removal.index] = removal  # keep the signatures for the next try
                self.counts["removal_short_of_quorum"] += 1
                return None
            self.open.pop(removal.index, None)
            news = self.take([removal])
            return news[0] if news else None

    def _release(self, removal: Removal, committed: int) -> None:
        """Take back this peer's promise of ``removal``, which no majority can sign: restore
        the seat's departure and the promise it replaced. Call under the lock."""
        index, step = removal.index, removal.from_step
        if (
            (index, step) not in self.before
            or self.state.members.seats[index].gone_from != step
            or self._superseded(index, step)
        ):
            return  # decided, superseded or released since it was asked about
        gone_from, undecided = self.before.pop((index, step))
        known = self.decided.get(index)
        if known is not None:  # a later removal, decided while this promise held
            gone_from = known.from_step if gone_from is None else min(gone_from, known.from_step)
            undecided = None if undecided == known.from_step else undecided
        if self.open.get(index, removal).from_step == step:
            self.open.pop(index, None)
        self.state.reinstate(index, gone_from)
        if undecided is None:
            self.state.undecided.pop(index, None)
            self.promised.discard(index)
        else:
            self.state.undecided[index] = undecided
        self.counts["removal_released"] += 1
        self.cond.notify_all()
        self.say(
            f"released the removal of client {index} from step {step}: {committed} voters "
            "committed that step, so no majority can sign it"
        )

    def _read_reply(
        self, reply: bytes | None, removal: Removal
    ) -> tuple[Removal | None, str | None]:
        """The co-signed ``removal`` a reply brings, or the reason it gives for refusing."""
        if reply is None:
            return None, None
        try:
            header: dict[str, Any] = Frame.decode(reply).header
        except TransportError:
            return None, None
        refused = header.get("refused")
        if isinstance(refused, str):
            return None, refused
        found, _ = read_removals([header["removal"]] if "removal" in header else None)
        if len(found) != 1 or (found[0].index, found[0].from_step) != (
            removal.index,
            removal.from_step,
        ):
            return None, None
        return found[0], None
