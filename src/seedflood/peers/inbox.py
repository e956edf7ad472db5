"""The door every flooded batch passes before it touches a peer's state.

Verdicts, per (origin, round) batch, in this order:

- ``replayed``: the frame states a run context other than this run's and the batch's signature
  is valid for that stated context: a real batch of another run (or of an earlier run under the
  same run id: its genesis differs) played into this one.
- ``not_member``: the origin holds no seat covering the batch's steps. A joiner's admission may
  still be on its way when its first batch arrives, so such a batch waits until this peer has
  committed past its first step: by then the admission, which rides on a message of an earlier
  step, would have been committed too. Steps before the seat's first step are refused at once.
- ``forged``: the signature does not verify under the origin's key (a changed scalar or
  control, a subset of the batch, another key, no signature).
- ``equivocation``: a validly signed batch for an (origin, round) already accepted with other
  scalars or controls.

Honest peers verify before they forward, so whoever delivers a rejected batch is the offender
and is banned: its frames are dropped and nothing is pushed to it. Equivocation is the one
exception: an honest forwarder may hold the origin's other version, so no one is banned; the two
signed versions are kept (``equivocations``) as the evidence that removes the origin by quorum
(`seedflood.peers.quorum`). Until that removal's step the run still needs the origin's
messages, so its frames are still read.

Before any of these, a batch must lie in the step window (`window_end`): no honest peer is ever
more than ``2 · staleness + 1`` rounds ahead of another member's next round, so a batch further
ahead is refused as ``beyond_window`` before its signature is checked, and is never held,
stored or forwarded. Its deliverer is not banned: an honest forwarder's window starts where its
own commits are, so a bad origin's batch may pass its window and not this one.

Checking is split so that the node's lock is held only to record a verdict: `Door.check` (the
signature, the costly part) runs outside it, on the member table as it stands; `Door.judge`
under the lock reuses that check when the origin's key is still the one it was made with.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from seedflood.peers.crypto import (
    Context,
    SignedBatch,
    b64,
    controls_from_json,
    group_batches,
    parse_public,
)
from seedflood.peers.removals import Equivocation
from seedflood.peers.roster import Members
from seedflood.protocol.messages import decode_packet, encode_packet

WAITING_KEPT = 256
WINDOW_SPARE_ROUNDS = 2
"""Rounds of slack on top of the farthest an honest batch can be ahead (``2 · staleness + 1``)."""
BATCH_WIRE_BYTES = 4096
"""Frame bytes one batch may take beside its scalars: its signature entry (about 100 bytes) and
the admissions and hash claims its messages carry (about 250 and 110 bytes each), generously."""
MESSAGE_WIRE_BYTES = 16
"""Codec bytes one message may take: a 4-byte scalar and, at worst, its own group's varints."""
SEAT_WIRE_BYTES = 512
"""Bytes of a seat in a members table (peer id, first step, departure, key), generously."""
SEAT_SLACK = 64
"""Seats a peer may not know of yet (admissions on their way) when sizing what others send."""
FRAME_SLACK = 64 << 10
"""Header bytes of a frame besides its batches (run context, departures), generously."""


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    WAITING = "waiting"
    IGNORED = "ignored"
    REPLAYED = "replayed"
    NOT_MEMBER = "not_member"
    FORGED = "forged"
    EQUIVOCATION = "equivocation"
    BEYOND_WINDOW = "beyond_window"


REJECTIONS = (Verdict.REPLAYED, Verdict.NOT_MEMBER, Verdict.FORGED, Verdict.EQUIVOCATION)


def window_rounds(staleness: int) -> int:
    """Rounds past a peer's next round whose batches it takes. Round r starts once every step of
    rounds before r - s is committed, and those steps hold every member's message, so when
    anyone makes round r every member has begun round r - s - 1 and committed up to it: an
    honest batch is at most 2s + 1 rounds past any member's next round."""
    return 2 * staleness + 1 + WINDOW_SPARE_ROUNDS


def window_end(committed_step: int, first_step: int, local_steps: int, staleness: int) -> int:
    """The last round a peer takes batches of. It counts from its committed step, or, for a
    joiner still replaying the log, from its first step, which the others wait for."""
    next_step = max(committed_step, first_step - 1) + 1
    return next_step // local_steps + window_rounds(staleness)


def batch_limit(seats: int, staleness: int) -> int:
    """The most batches an honest frame holds: every member's rounds within a window, and the
    batches that waited for their origin's admission."""
    return (seats + SEAT_SLACK) * (window_rounds(staleness) + 1) + WAITING_KEPT


def frame_cap(seats: int, staleness: int, local_steps: int) -> int:
    """The largest flood or sync frame an honest member sends in a run of ``seats`` members:
    a window of batches and a members table."""
    batch = BATCH_WIRE_BYTES + MESSAGE_WIRE_BYTES * local_steps
    table = (seats + SEAT_SLACK) * SEAT_WIRE_BYTES
    return FRAME_SLACK + table + batch_limit(seats, staleness) * batch


@dataclass(frozen=True)
class Checked:
    """A batch's signature, checked outside the node's lock under its origin's key as the member
    table had it then ("" when none was known)."""

    key: str
    valid: bool


class Door:
    """Judges batches for one peer and remembers every batch it let in, to forward and serve."""

    def __init__(
        self, context: Context, local_steps: int, say: Callable[[str], None] | None = None
    ) -> None:
        self.context, self.local_steps, self.say = context, local_steps, say
        self.batches: dict[tuple[int, int], SignedBatch] = {}
        # Counts and bans also come from the link's threads, which never take the node's lock.
        self._lock = threading.Lock()
        self.rejected: dict[str, int] = {str(v): 0 for v in REJECTIONS}
        self.banned: dict[str, str] = {}
        self.waiting: list[tuple[str, Context, SignedBatch]] = []
        self.equivocations: dict[int, Equivocation] = {}

    def check(self, stated: Context, batch: SignedBatch, members: Members) -> Checked:
        """The signature check, the costly part of a verdict; safe without the node's lock
        (a seat, once known, keeps its first step, and its key only goes from none to one)."""
        seat = members.seats.get(batch.origin)
        key = seat.key if seat is not None else ""
        public = parse_public(key)
        return Checked(key, public is not None and batch.verifies(public, stated))

    def screen(
        self, deliverer: str, stated: Context, batch: SignedBatch, members: Members
    ) -> Checked | None:
        """`check`, and the refusals that follow from the seat and the signature alone (not a
        member from its first step, replayed, forged), counted and the deliverer banned at once,
        so that checking a frame stops at its first offence; None when refused."""
        checked = self.check(stated, batch, members)
        verdict = self._signed_verdict(stated, batch, members, checked)
        if verdict is None:
            return checked
        reason = f"{verdict} batch of client {batch.origin}, round {batch.round}"
        self.refuse(deliverer, str(verdict), reason)
        return None

    def judge(
        self,
        deliverer: str,
        stated: Context,
        batch: SignedBatch,
        members: Members,
        committed_step: int,
        checked: Checked | None = None,
    ) -> Verdict:
        verdict = self._verdict(stated, batch, members, committed_step, checked)
        if verdict is Verdict.WAITING:
            self.waiting = [*self.waiting[-WAITING_KEPT + 1 :], (deliverer, stated, batch)]
        elif verdict is Verdict.ACCEPTED:
            self.batches[(batch.origin, batch.round)] = batch
        elif verdict is Verdict.EQUIVOCATION:  # no ban: the two versions are the evidence
            held = self.batches[(batch.origin, batch.round)]
            self.equivocations.setdefault(batch.origin, Equivocation(held, batch))
            self.count(str(verdict))
        elif verdict in REJECTIONS:
            reason = f"{verdict} batch of client {batch.origin}, round {batch.round}"
            self.refuse(deliverer, str(verdict), reason)
        return verdict

    def _verdict(
        self,
        stated: Context,
        batch: SignedBatch,
        members: Members,
        committed_step: int,
        checked: Checked | None,
    ) -> Verdict:
        seat = members.seats.get(batch.origin)
        first = batch.messages[0].step if batch.messages else -1
        if seat is None or parse_public(seat.key) is None:
            return Verdict.NOT_MEMBER if first <= committed_step else Verdict.WAITING
        signed = self._signed_verdict(stated, batch, members, checked)
        if signed is not None:
            return signed
        if seat.gone_from is not None and first >= seat.gone_from:
            return Verdict.IGNORED
        held = self.batches.get((batch.origin, batch.round))
        if held is None:
            return Verdict.ACCEPTED
        return Verdict.DUPLICATE if held.same_content(batch) else Verdict.EQUIVOCATION

    def _signed_verdict(
        self, stated: Context, batch: SignedBatch, members: Members, checked: Checked | None
    ) -> Verdict | None:
        """The verdicts that follow from the seat and the signature alone; None when the batch
        is signed for this run by a member of its steps (or its origin's key is not known)."""
        seat = members.seats.get(batch.origin)
        if seat is None or parse_public(seat.key) is None:
            return None
        first = batch.messages[0].step if batch.messages else -1
        if first < seat.first_step:
            return Verdict.NOT_MEMBER
        if checked is None or checked.key != seat.key:
            checked = self.check(stated, batch, members)
        if not checked.valid:
            return Verdict.FORGED
        return Verdict.REPLAYED if stated != self.context else None

    def count(self, reason: str) -> None:
        """One more refusal for ``reason``; reasons beyond the door's verdicts are listed from
        their first refusal on."""
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def refuse(self, peer_id: str, reason: str, why: str | None = None) -> None:
        """Count a refusal, and ban ``peer_id`` when ``why`` says what it did."""
        self.count(reason)
        if why is not None:
            self.ban(peer_id, why)

    def ban(self, peer_id: str, reason: str) -> None:
        with self._lock:
            new = peer_id not in self.banned
            if new:
                self.banned[peer_id] = reason
        if new and self.say is not None:
            self.say(f"banned {peer_id}: {reason}")

    def settle(self, members: Members, committed_step: int) -> list[SignedBatch]:
        """Judge again the batches that waited for their origin's admission; the accepted."""
        waiting, self.waiting, accepted = self.waiting, [], []
        for deliverer, stated, batch in waiting:
            if deliverer in self.banned:
                continue
            if self.judge(deliverer, stated, batch, members, committed_step) is Verdict.ACCEPTED:
                accepted.append(batch)
        return accepted

    def since(self, step: int) -> list[SignedBatch]:
        """Every batch let in with a step at or after ``step``, whole, in canonical order."""
        first_round = step // self.local_steps
        held = list(self.batches.values())  # a snapshot: safe beside a thread that adds batches
        found = [b for b in held if b.round >= first_round]
        return sorted(found, key=lambda b: (b.round, b.origin))


class BatchStore:
    """The door's batches on disk, one JSON line each, so a restarted peer can still serve its
    committed messages with their signatures; a line cut by a crash is dropped on load. Appends
    come from several threads, outside the node's lock, so the file has its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> list[SignedBatch]:
        if not self.path.is_file():
            return []
        batches = []
        for line in self.path.read_text().splitlines():
            try:
                batches.append(SignedBatch.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
        return batches

    def add(self, batches: Iterable[SignedBatch]) -> None:
        lines = "".join(json.dumps(b.to_json(), separators=(",", ":")) + "\n" for b in batches)
        if not lines:
            return
        with self._lock, self.path.open("a") as file:
            file.write(lines)
            file.flush()
            os.fsync(file.fileno())


def batch_header(context: Context, batches: Iterable[SignedBatch]) -> dict[str, Any]:
    """The frame header that lets a receiver rebuild and check ``batches`` from the body."""
    batches = list(batches)
    carried = [[s, o, c] for b in batches for (s, o), c in sorted(b.controls.items())]
    signatures = [[b.origin, b.round, base64.b64encode(b.signature).decode()] for b in batches]
    return {"run": [context.run_id, context.genesis], "sigs": signatures, "carried": carried}


def batch_body(batches: Iterable[SignedBatch], scalar_format: str) -> bytes:
    messages = [m for b in batches for m in b.messages]
    return encode_packet(messages, scalar_format) if messages else b""


def read_batches(
    header: dict[str, Any], body: bytes, local_steps: int
) -> tuple[Context, list[SignedBatch]]:
    """The stated context and the batches of a frame; a message with no signature of its batch
    yields a batch with an empty signature, which the door calls forged."""
    messages, _ = decode_packet(body) if body else ([], "")
    try:
        run_id, genesis = header.get("run") or ["", ""]
        stated = Context(str(run_id), str(genesis))
        bytes.fromhex(stated.genesis)
        signatures = {(int(o), int(r)): b64(s) for o, r, s in header.get("sigs") or []}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad signature header: {exc}") from None
    controls = controls_from_json(header.get("carried"))
    for entries in controls.values():
        for control in entries:
            check_control(control)
    batches = group_batches(messages, controls, local_steps)
    for batch in batches:
        batch.signature = signatures.get((batch.origin, batch.round), b"")
    return stated, batches


CONTROL_FIELDS: dict[str, dict[str, type]] = {
    "admit": {"index": int, "peer": str, "first_step": int},
    "hash": {"step": int, "hash": str},
}


def check_control(control: Any) -> None:
    """A control a peer's state can take without a KeyError: the fields of its kind, typed.
    Signed controls are still input: a member may sign nonsense."""
    if not isinstance(control, dict):
        raise ValueError(f"a control is a JSON object, not {type(control).__name__}")
    kind = control.get("kind")
    for name, expected in CONTROL_FIELDS.get(kind if isinstance(kind, str) else "", {}).items():
        value = control.get(name)
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ValueError(f"{kind} control lacks a valid {name!r}: {str(value)[:40]!r}")
        if expected is int and value < 0:
            raise ValueError(f"{kind} control has a negative {name!r}: {value}")
    if kind == "admit" and not isinstance(control.get("key", ""), str):
        raise ValueError("admit control has a key that is not text")
