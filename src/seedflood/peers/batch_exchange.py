"""How a peer process moves signed batches: pushes to neighbours, pull repair, joins.

Everything that arrives, pushed or pulled, passes the door (`seedflood.peers.inbox`) batch by batch
before `PeerState` sees it, and only what passed is pushed on, whole and with its origin's
signature. The exchange is also its link's gate (`seedflood.peers.p2p.Gate`): frames from a
banned peer, or on flood and sync from a peer id that holds no live seat, are dropped unread, and
each protocol's frames are capped at what an honest member can send (`inbox.frame_cap`). Batches
beyond the step window are refused, and what arrives is checked outside the node's lock: only
the verdicts and what they change in the state take it. A pull names the window it takes and is
answered with at most a window's batches; the puller pulls again for the rest. The node owns one
`Exchange`; who the neighbours are is its seating's business (`seedflood.peers.seats`), reached
through `Wiring`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from seedflood.peers.admission import ConfigRecordError, SharedConfig
from seedflood.peers.crypto import Context, SignedBatch, parse_public, verify_join
from seedflood.peers.inbox import (
    SEAT_SLACK,
    Checked,
    Verdict,
    batch_body,
    batch_header,
    batch_limit,
    frame_cap,
    read_batches,
    window_end,
)
from seedflood.peers.options import PeerError, Say
from seedflood.peers.p2p import (
    FAULTS_VARIABLE,
    JOIN_PROTOCOL,
    MAX_FRAME_BYTES,
    SYNC_PROTOCOL,
    FaultyLink,
    Frame,
    Link,
    Refusal,
    TransportError,
    join_cap,
    parse_faults,
)
from seedflood.peers.removals import Removal, read_removals
from seedflood.peers.state import NotAllowed
from seedflood.protocol.antientropy import Digest, decode_digest, digest_of_pending, encode_digest
from seedflood.protocol.messages import MAX_ID, SCALAR_BYTES, Message
from seedflood.protocol.traffic import EdgeTraffic

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from seedflood.config import RunConfig
    from seedflood.peers.inbox import BatchStore, Door
    from seedflood.peers.p2p import EventLoopThread, Handler
    from seedflood.peers.quorum import Quorum
    from seedflood.peers.state import PeerState

__all__ = ["Exchange", "Wiring", "open_link"]

LET_IN = (Verdict.ACCEPTED, Verdict.DUPLICATE)
BANNED_FOR = (Refusal.OVERSIZED, Refusal.UNDECODABLE)
"""Refusals that prove the sender lied: no honest peer sends such a frame. A non-member caller
is not banned: a joiner may pull before this peer has learnt of its admission."""


def _lacks(digest: Digest, message: Message) -> bool:
    return not digest.holds(message.step, message.origin)


def open_link(p2p: Any, runner: EventLoopThread, handlers: Mapping[str, Handler], say: Say) -> Link:
    """The plain link, or, when ``$SEEDFLOOD_LINK_FAULTS`` asks for it (tests do), a link
    that drops, repeats, delays or corrupts flood pushes on purpose."""
    faults = os.environ.get(FAULTS_VARIABLE, "")
    if not faults:
        return Link(p2p, runner, handlers, timeout=10.0)
    try:
        rates, seed = parse_faults(faults)
    except ValueError as error:
        raise PeerError(str(error)) from None
    say(f"link faults on purpose: {faults}")
    return FaultyLink(p2p, runner, handlers, 10.0, rates=rates, seed=seed)


class Wiring(Protocol):
    """Who the neighbours are, recomputed when members come, go or are banned."""

    neighbors: dict[int, str]

    def rewire(self) -> None: ...


class Exchange:
    """This peer's traffic in signed batches. Built only once the seat is known: the member
    table, the door and the signing context all follow from it."""

    def __init__(
        self,
        *,
        config: RunConfig,
        cond: threading.Condition,
        link: Link,
        wiring: Wiring,
        state: PeerState,
        door: Door,
        store: BatchStore,
        context: Context,
        signing_key: Ed25519PrivateKey,
        quorum: Quorum,
    ) -> None:
        self.config, self.cond, self.link, self.wiring = config, cond, link, wiring
        self.state, self.door, self.store = state, door, store
        self.context, self.signing_key, self.quorum = context, signing_key, quorum
        self.shared = SharedConfig.of(config)
        self.edges: dict[tuple[int, int], EdgeTraffic] = {}
        self.signature_bytes = 0

    # -- the gate: whom the link hears, and how much -------------------------------------------

    def refusal(self, caller: str, protocol: str) -> Refusal | None:
        """Banned callers are not heard at all; on flood and sync only live members are (a
        joiner is not one yet, so joins are open to anyone else), except that a member the
        quorum removed may still pull: it is answered with the batches of the steps before its
        removal and the removal itself (`on_sync`), so that it stops once it made its last
        messages instead of waiting forever on steps it no longer takes part in."""
        if caller in self.door.banned:
            return Refusal.BANNED_CALLER
        if protocol == JOIN_PROTOCOL or caller in self._member_ids():
            return None
        if protocol == SYNC_PROTOCOL and self._removal_of(caller) is not None:
            return None
        return Refusal.NOT_MEMBER_CALLER

    def _member_ids(self) -> set[str]:
        seats = list(self.state.members.seats.values())  # a snapshot, without the node's lock
        return {seat.peer_id for seat in seats if seat.gone_from is None}

    def _removal_of(self, caller: str) -> Removal | None:
        """The decided removal of the seat ``caller`` held, if the quorum removed it."""
        seats = dict(self.state.members.seats)  # a snapshot, without the node's lock
        decided = list(self.quorum.decided.values())
        return next(
            (r for r in decided if r.index in seats and seats[r.index].peer_id == caller), None
        )

    def cap(self, protocol: str, reply: bool) -> int:
        """Joins have fixed caps; flood and sync frames are capped by a window of every
        member's batches and a members table (`inbox.frame_cap`)."""
        if protocol == JOIN_PROTOCOL:
            return join_cap(reply)
        seats = len(self.state.members.seats)
        return min(MAX_FRAME_BYTES, frame_cap(seats, self.state.staleness, self.state.local_steps))

    def refused(self, peer: str, protocol: str, reason: Refusal) -> None:
        why = f"sent an {reason} {protocol} frame" if reason in BANNED_FOR else None
        self.door.refuse(peer, str(reason), why)

    def window_end(self) -> int:
        """The last round whose batches this peer takes now (`inbox.window_end`)."""
        state = self.state
        seat = state.members.seats.get(state.me)
        first = seat.first_step if seat is not None else 0
        return window_end(state.committed_step, first, state.local_steps, state.staleness)

    # -- receiving ------------------------------------------------------------------------------

    def restore(self) -> None:
        """Take back what was held before a crash, with its signatures. A store written before
        the step window existed may hold batches far ahead: they are left out, and counted."""
        last = self.window_end()
        for batch in self.store.load():
            if batch.round > last:
                self.door.count(Verdict.BEYOND_WINDOW)
                continue
            self.door.batches[(batch.origin, batch.round)] = batch
            self.state.receive(batch.messages, batch.controls)

    def on_flood(self, caller: str, data: bytes) -> None:
        self.take(caller, Frame.decode(data))
        return None

    def take(self, caller: str, frame: Frame) -> int:
        """Let in what a flood or sync frame brings that passes the door, hold what is new, and
        push its batches on to every neighbour but the one it came from; how many messages were
        new. Only recording the verdicts takes the node's lock."""
        if caller in self.door.banned:
            return 0
        try:
            stated, batches = read_batches(frame.header, frame.body, self.state.local_steps)
        except ValueError:  # the codec's errors are ValueErrors too
            self.refused(caller, "flood or sync", Refusal.UNDECODABLE)
            return 0
        removals, malformed = read_removals(frame.header.get("removals"))
        if malformed:
            self.refused(caller, "flood or sync", Refusal.UNDECODABLE)
            return 0
        banned = len(self.door.banned)
        checked = self._screen(caller, stated, batches)
        with self.cond:
            seats = len(self.state.members.seats)
            verdicts = [self._admit_batch(caller, stated, b, c) for b, c in checked]
            accepted = [
                b for (b, _), (v, _) in zip(checked, verdicts, strict=True) if v is Verdict.ACCEPTED
            ]
            passed = [b for (b, _), (_, fresh) in zip(checked, verdicts, strict=True) if fresh]
            passed += self.settled()
            gone = self.quorum.take(removals) if caller not in self.door.banned else []
            if gone or len(self.state.members.seats) != seats or len(self.door.banned) > banned:
                self.wiring.rewire()
            if passed or gone:
                self.cond.notify_all()
            targets = {i: p for i, p in self.wiring.neighbors.items() if p != caller}
        self.store.add(accepted)
        if passed or gone:
            self.push(targets, passed, gone)
        return sum(fresh for _, fresh in verdicts)

    def _screen(
        self, caller: str, stated: Context, batches: list[SignedBatch]
    ) -> list[tuple[SignedBatch, Checked]]:
        """The batches worth judging, each with its signature checked, without the node's lock:
        those beyond the window are refused unchecked, and checking stops once the caller is
        banned (by this frame or another)."""
        last, members, kept = self.window_end(), self.state.members, []
        for batch in batches:
            if caller in self.door.banned:
                break
            if batch.round > last:
                self.door.count(Verdict.BEYOND_WINDOW)
                continue
            checked = self.door.screen(caller, stated, batch, members)
            if checked is not None:
                kept.append((batch, checked))
        return kept

    def _admit_batch(
        self, caller: str, stated: Context, batch: SignedBatch, checked: Checked
    ) -> tuple[Verdict, int]:
        """The door's verdict on one batch and how many of its messages were new to the state
        (held, so pushed on); call under the lock."""
        verdict = self.door.judge(
            caller, stated, batch, self.state.members, self.state.committed_step, checked
        )
        if verdict not in LET_IN:
            return verdict, 0
        return verdict, len(self.state.receive(batch.messages, batch.controls))

    def settled(self) -> list[SignedBatch]:
        """Batches that waited for their origin's admission and now pass; call under the lock."""
        passed = self.door.settle(self.state.members, self.state.committed_step)
        self.store.add(passed)
        return [b for b in passed if self.state.receive(b.messages, b.controls)]

    # -- serving --------------------------------------------------------------------------------

    def on_sync(self, caller: str, data: bytes) -> bytes:
        """Answer a member's pull with the batches its digest lacks (all since its committed
        prefix when it sent none), within the window it names and at most a window's worth:
        anti-entropy, so a lossy link costs what was lost, and no request costs more."""
        request = Frame.decode(data)
        since, until = _pull_range(request.header)
        removed = self._removal_of(caller)
        if removed is not None:  # a member until its removal: it gets no step after that
            until = min(until, removed.from_step - 1)
        held = decode_digest(request.body) if request.body else None
        if (
            held is not None
            and len(held.first_missing) > len(self.state.members.seats) + SEAT_SLACK
        ):
            raise TransportError(f"{caller} sent a digest of {len(held.first_missing)} origins")
        batches = [b for b in self.door.since(since) if b.round * self.state.local_steps <= until]
        if held is not None:
            batches = [b for b in batches if any(_lacks(held, m) for m in b.messages)]
        with self.cond:
            removals = [r.to_wire() for r in self.quorum.known()]
            seats = len(self.state.members.seats)
        return self._reply(batches, removals, seats)

    def _reply(self, batches: list[SignedBatch], removals: list[Any], seats: int) -> bytes:
        """The first batches that fit, with every removal decided so far: at most
        `inbox.batch_limit` batches, halved until the frame is within the cap the puller
        applies."""
        limit = min(len(batches), batch_limit(seats, self.state.staleness))
        cap = self.cap(SYNC_PROTOCOL, reply=True)
        while True:
            chosen = batches[:limit]
            header = {**batch_header(self.context, chosen), "removals": removals}
            data = Frame(header, batch_body(chosen, self.config.scalar_format)).encode()
            if len(data) <= cap or not limit:
                return data
            limit //= 2

    def on_join(self, caller: str, data: bytes) -> bytes:
        """Sponsor a joiner with a valid key and the run's shared config. One whose config
        differs is answered with this peer's, before anything is admitted, so that it can name
        the keys that differ."""
        header = Frame.decode(data).header
        peer_id, key = str(header.get("peer", "")), str(header.get("key", ""))
        if peer_id != caller:
            raise TransportError(f"{caller} asked to seat another peer, {peer_id[:60]!r}")
        if parse_public(key) is None:
            raise TransportError(f"{caller} asked to join without a valid public key: {key[:70]!r}")
        try:
            joiner = SharedConfig.read(header.get("config"))
        except ConfigRecordError as error:
            raise TransportError(f"{caller} asked to join with a bad config: {error}") from None
        if joiner.digest != self.shared.digest:
            return Frame({"config": self.shared.to_record()}).encode()
        if not verify_join(key, self.context.run_id, caller, header.get("proof")):
            raise TransportError(f"{caller} asked to join without proof that it holds its key")
        with self.cond:
            try:
                index = self.state.admit(peer_id, key)
            except NotAllowed as refusal:
                return Frame({"refused": str(refusal)}).encode()
            self.cond.wait_for(lambda: index in self.state.members.seats, timeout=60)
            seat = self.state.members.seats[index]
            members = self.state.members.to_json()
        return Frame({"index": index, "first_step": seat.first_step, "members": members}).encode()

    def sign_own(self, round_index: int, messages: Sequence[Message]) -> SignedBatch:
        """This client's batch of the round, signed, kept and stored; call under the lock."""
        carried = {
            m.key: self.state.carried[m.key] for m in messages if m.key in self.state.carried
        }
        batch = SignedBatch(self.state.me, round_index, tuple(messages), carried)
        batch.sign(self.signing_key, self.context)
        self.door.batches[(batch.origin, batch.round)] = batch
        self.store.add([batch])
        return batch

    def equivocate(self, targets: dict[int, str], batch: SignedBatch) -> None:
        """Misbehave on purpose, for tests: push ``batch`` to half of ``targets`` and another
        version of it, its scalars negated and signed too, to the other half."""
        negated = tuple(replace(m, scalar=-m.scalar) for m in batch.messages)
        other = SignedBatch(batch.origin, batch.round, negated, dict(batch.controls))
        other.sign(self.signing_key, self.context)
        order = sorted(targets)
        half = {i: targets[i] for i in order[: len(order) // 2]}
        self.push(half, [batch], [])
        self.push({i: targets[i] for i in order if i not in half}, [other], [])

    def attack(self, targets: dict[int, str], round_index: int) -> None:
        """Misbehave on purpose, for tests, as a member may: push signed batches of this peer's
        own for step 600,000 and step 10^12; a frame whose header carries a members table with
        a phantom seat and an unsigned eviction of client 0, fields no honest peer reads; and
        last a batch of the next round under a signature that does not verify, which gets this
        peer banned by every neighbour."""
        me, local_steps = self.state.me, self.state.local_steps
        far = [
            SignedBatch(me, step // local_steps, (Message(step, me, 1.0),))
            for step in (600_000, 10**12)
        ]
        for batch in far:
            batch.sign(self.signing_key, self.context)
        self.push(targets, far, [])
        phantom = {"members": {"99": ["QmPhantom", 0, None, ""]}, "gone": [[0, 0]]}
        self.link.push({peer: Frame(phantom).encode() for peer in targets.values()})
        step = (round_index + 1) * local_steps
        forged = SignedBatch(me, round_index + 1, (Message(step, me, 1.0),), signature=bytes(64))
        self.push(targets, [forged], [])

    def push(
        self, targets: dict[int, str], batches: list[SignedBatch], removals: list[Removal]
    ) -> None:
        header: dict[str, Any] = batch_header(self.context, batches)
        if removals:
            header["removals"] = [r.to_wire() for r in removals]
        body = batch_body(batches, self.config.scalar_format)
        data = Frame(header, body).encode()
        reached = self.link.push({peer: data for peer in targets.values()})
        messages = sum(len(b.messages) for b in batches)
        scalar_bytes = SCALAR_BYTES[self.config.scalar_format]
        signatures = len(json.dumps([header["run"], header["sigs"]], separators=(",", ":")))
        with self.cond:
            for index, peer in targets.items():
                if peer in reached and messages:
                    edge = self.edges.setdefault((self.state.me, index), EdgeTraffic())
                    edge.bytes += len(body)
                    edge.messages += messages
                    edge.packets += 1
                    edge.header_bytes += len(body) - messages * scalar_bytes
                    self.signature_bytes += signatures

    def pull(self, peers: list[str]) -> int:
        """Fetch what ``peers`` hold beyond this peer's committed prefix, within its window; new
        messages found. A reply no honest peer sends gets its sender banned."""
        found = 0
        for peer in peers:
            reply = self.link.request(peer, SYNC_PROTOCOL, self._pull_request())
            if reply is None or peer in self.door.banned:
                continue
            try:
                frame = Frame.decode(reply)
            except TransportError:
                self.refused(peer, SYNC_PROTOCOL, Refusal.UNDECODABLE)
                continue
            found += self.take(peer, frame)
        return found

    def _pull_request(self) -> bytes:
        """A digest of what is held past the committed prefix, and the window asked for."""
        with self.cond:
            since = self.state.committed_step + 1
            held = digest_of_pending(
                self.state.committed_step, self.state.pending, self.state.members.next_index()
            )
        until = (self.window_end() + 1) * self.state.local_steps - 1
        return Frame({"since": since, "until": until}, encode_digest(held)).encode()


def _pull_range(header: dict[str, Any]) -> tuple[int, int]:
    """The first step a pull asks for and its last (a puller that names none takes any)."""
    try:
        since = int(header["since"])
        until = int(header.get("until", MAX_ID))
    except (KeyError, TypeError, ValueError) as error:
        raise TransportError(f"a pull names no steps: {error!r}") from None
    return since, until
