"""How a peer process moves signed batches: pushes to neighbours, pull repair, joins.

Everything that arrives, pushed or pulled, passes the door (`seedflood.peers.inbox`) batch by batch
before `PeerState` sees it, and only what passed is pushed on, whole and with its origin's
signature. Frames from a banned peer are dropped unread. The node owns one `Exchange`; who the
neighbours are is its seating's business (`seedflood.peers.seats`), reached through `Wiring`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from seedflood.peers.admission import ConfigRecordError, SharedConfig
from seedflood.peers.crypto import Context, SignedBatch, parse_public
from seedflood.peers.inbox import Verdict, batch_body, batch_header, read_batches
from seedflood.peers.options import PeerError, Say
from seedflood.peers.p2p import (
    FAULTS_VARIABLE,
    SYNC_PROTOCOL,
    FaultyLink,
    Frame,
    Link,
    TransportError,
    parse_faults,
)
from seedflood.peers.state import Members
from seedflood.protocol.antientropy import Digest, decode_digest, digest_of_pending, encode_digest
from seedflood.protocol.messages import SCALAR_BYTES, CodecError, Message
from seedflood.protocol.traffic import EdgeTraffic

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from seedflood.config import RunConfig
    from seedflood.peers.inbox import BatchStore, Door
    from seedflood.peers.p2p import EventLoopThread, Handler
    from seedflood.peers.state import PeerState

__all__ = ["Exchange", "Wiring", "open_link"]

LET_IN = (Verdict.ACCEPTED, Verdict.DUPLICATE)


def _lacks(digest: Digest, message: Message) -> bool:
    return not digest.held(message.step) >> message.origin & 1


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
    ) -> None:
        self.config, self.cond, self.link, self.wiring = config, cond, link, wiring
        self.state, self.door, self.store = state, door, store
        self.context, self.signing_key = context, signing_key
        self.shared = SharedConfig.of(config)
        self.edges: dict[tuple[int, int], EdgeTraffic] = {}
        self.signature_bytes = 0

    def restore(self) -> None:
        """Take back what was held before a crash, with its signatures."""
        for batch in self.store.load():
            self.door.batches[(batch.origin, batch.round)] = batch
            self.state.receive(batch.messages, batch.controls)

    def on_flood(self, caller: str, data: bytes) -> None:
        self.take(caller, Frame.decode(data))
        return None

    def take(self, caller: str, frame: Frame) -> int:
        """Let in what a flood or sync frame brings that passes the door, hold what is new, and
        push its batches on to every neighbour but the one it came from; how many messages were
        new."""
        if caller in self.door.banned:
            return 0
        try:
            stated, batches = read_batches(frame.header, frame.body, self.state.local_steps)
        except ValueError:  # not a frame an honest peer sends; TransportError-like
            return 0
        with self.cond:
            banned = len(self.door.banned)
            seats = len(self.state.members.seats)
            verdicts = [self._admit_batch(caller, stated, batch) for batch in batches]
            passed = [b for b, (verdict, fresh) in zip(batches, verdicts, strict=True) if fresh]
            passed += self.settled()
            gone = [
                (int(index), int(step))
                for index, step in frame.header.get("gone", [])
                if caller not in self.door.banned and self.state.depart(int(index), int(step))
            ]
            if gone or len(self.state.members.seats) != seats or len(self.door.banned) > banned:
                self.wiring.rewire()
            if passed or gone:
                self.cond.notify_all()
            targets = {i: p for i, p in self.wiring.neighbors.items() if p != caller}
        if passed or gone:
            self.push(targets, passed, gone)
        return sum(fresh for _, fresh in verdicts)

    def _admit_batch(self, caller: str, stated: Context, batch: SignedBatch) -> tuple[Verdict, int]:
        """The door's verdict on one batch and how many of its messages were new to the state
        (held, so pushed on)."""
        verdict = self.door.judge(
            caller, stated, batch, self.state.members, self.state.committed_step
        )
        if verdict not in LET_IN:
            return verdict, 0
        if verdict is Verdict.ACCEPTED:
            self.store.add([batch])
        return verdict, len(self.state.receive(batch.messages, batch.controls))

    def settled(self) -> list[SignedBatch]:
        """Batches that waited for their origin's admission and now pass; call under the lock."""
        passed = self.door.settle(self.state.members, self.state.committed_step)
        self.store.add(passed)
        return [b for b in passed if self.state.receive(b.messages, b.controls)]

    def on_sync(self, caller: str, data: bytes) -> bytes:
        """Answer a pull with the batches the caller's digest lacks (all since its committed
        prefix when it sent none): anti-entropy, so a lossy link costs what was lost."""
        request = Frame.decode(data)
        since = int(request.header["since"])
        if caller in self.door.banned:
            raise TransportError(f"{caller} is banned")
        try:
            held = decode_digest(request.body) if request.body else None
        except CodecError as error:
            raise TransportError(f"{caller} sent a bad digest: {error}") from None
        with self.cond:
            batches = self.door.since(since)
            members = self.state.members.to_json()
        if held is not None:
            batches = [b for b in batches if any(_lacks(held, m) for m in b.messages)]
        header = {**batch_header(self.context, batches), "members": members}
        return Frame(header, batch_body(batches, self.config.scalar_format)).encode()

    def on_join(self, caller: str, data: bytes) -> bytes:
        """Sponsor a joiner with a valid key and the run's shared config. One whose config
        differs is answered with this peer's, before anything is admitted, so that it can name
        the keys that differ."""
        header = Frame.decode(data).header
        peer_id, key = str(header["peer"]), str(header.get("key", ""))
        if parse_public(key) is None:
            raise TransportError(f"{caller} asked to join without a valid public key: {key[:70]!r}")
        try:
            joiner = SharedConfig.read(header.get("config"))
        except ConfigRecordError as error:
            raise TransportError(f"{caller} asked to join with a bad config: {error}") from None
        if joiner.digest != self.shared.digest:
            return Frame({"config": self.shared.to_record()}).encode()
        with self.cond:
            index = self.state.admit(peer_id, key)
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

    def push(
        self, targets: dict[int, str], batches: list[SignedBatch], gone: list[tuple[int, int]]
    ) -> None:
        header: dict[str, Any] = batch_header(self.context, batches)
        if gone:
            header["gone"] = [list(g) for g in gone]
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
        """Fetch what ``peers`` hold beyond this peer's committed prefix; new messages found."""
        found = 0
        for peer in peers:
            with self.cond:
                since = self.state.committed_step + 1
                held = digest_of_pending(
                    self.state.committed_step, self.state.pending, self.state.members.next_index()
                )
            request = Frame({"since": since}, encode_digest(held)).encode()
            reply = self.link.request(peer, SYNC_PROTOCOL, request)
            if reply is None or peer in self.door.banned:
                continue
            try:
                frame = Frame.decode(reply)
                members = Members.from_json(frame.header["members"])
            except (TransportError, KeyError, TypeError, ValueError, AttributeError):
                continue  # a reply no honest peer sends: ask the next one
            with self.cond:
                if self.state.learn(members):
                    self.wiring.rewire()
            found += self.take(peer, frame)
        return found
