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
exception: an honest forwarder may hold the origin's other version, so the origin is banned.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterable
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
from seedflood.peers.state import Members
from seedflood.protocol.messages import decode_packet, encode_packet

WAITING_KEPT = 256


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    WAITING = "waiting"
    IGNORED = "ignored"
    REPLAYED = "replayed"
    NOT_MEMBER = "not_member"
    FORGED = "forged"
    EQUIVOCATION = "equivocation"


REJECTIONS = (Verdict.REPLAYED, Verdict.NOT_MEMBER, Verdict.FORGED, Verdict.EQUIVOCATION)


class Door:
    """Judges batches for one peer and remembers every batch it let in, to forward and serve."""

    def __init__(
        self, context: Context, local_steps: int, say: Callable[[str], None] | None = None
    ) -> None:
        self.context, self.local_steps, self.say = context, local_steps, say
        self.batches: dict[tuple[int, int], SignedBatch] = {}
        self.rejected: dict[str, int] = {str(v): 0 for v in REJECTIONS}
        self.banned: dict[str, str] = {}
        self.waiting: list[tuple[str, Context, SignedBatch]] = []

    def judge(
        self,
        deliverer: str,
        stated: Context,
        batch: SignedBatch,
        members: Members,
        committed_step: int,
    ) -> Verdict:
        verdict = self._verdict(stated, batch, members, committed_step)
        if verdict is Verdict.WAITING:
            self.waiting = [*self.waiting[-WAITING_KEPT + 1 :], (deliverer, stated, batch)]
        elif verdict is Verdict.ACCEPTED:
            self.batches[(batch.origin, batch.round)] = batch
        elif verdict in REJECTIONS:
            self.rejected[str(verdict)] += 1
            offender = deliverer
            if verdict is Verdict.EQUIVOCATION:
                offender = members.seats[batch.origin].peer_id
            self.ban(offender, f"{verdict} batch of client {batch.origin}, round {batch.round}")
        return verdict

    def _verdict(
        self, stated: Context, batch: SignedBatch, members: Members, committed_step: int
    ) -> Verdict:
        seat = members.seats.get(batch.origin)
        public = parse_public(seat.key) if seat is not None else None
        first = batch.messages[0].step if batch.messages else -1
        if seat is None or public is None:
            return Verdict.NOT_MEMBER if first <= committed_step else Verdict.WAITING
        if first < seat.first_step:
            return Verdict.NOT_MEMBER
        if stated != self.context:
            return Verdict.REPLAYED if batch.verifies(public, stated) else Verdict.FORGED
        if not batch.verifies(public, self.context):
            return Verdict.FORGED
        if seat.gone_from is not None and first >= seat.gone_from:
            return Verdict.IGNORED
        held = self.batches.get((batch.origin, batch.round))
        if held is None:
            return Verdict.ACCEPTED
        return Verdict.DUPLICATE if held.same_content(batch) else Verdict.EQUIVOCATION

    def ban(self, peer_id: str, reason: str) -> None:
        if peer_id not in self.banned:
            self.banned[peer_id] = reason
            if self.say is not None:
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
        found = [b for (_, r), b in self.batches.items() if r >= first_round]
        return sorted(found, key=lambda b: (b.round, b.origin))


class BatchStore:
    """The door's batches on disk, one JSON line each, so a restarted peer can still serve its
    committed messages with their signatures; a line cut by a crash is dropped on load."""

    def __init__(self, path: Path) -> None:
        self.path = path
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
        with self.path.open("a") as file:
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
    batches = group_batches(messages, controls_from_json(header.get("carried")), local_steps)
    for batch in batches:
        batch.signature = signatures.get((batch.origin, batch.round), b"")
    return stated, batches
