"""Removals by quorum: "client i takes no step from s on", signed by a majority of the members.

A removal changes which messages every peer waits for, so an unsigned one let any node that
could reach a peer evict a member (one 20-byte push did), and one signed by a single member
would let one bad member evict the others. A removal therefore takes effect only under the
signatures of a majority of the members expected at its step, the removed one left out: each
member signs the same bytes (the run's context, the index, the step) only when its own view
agrees (`seedflood.peers.removal` decides when), and the signatures travel together, so every
peer checks each signer's own signature however many hops the removal came.

A member that equivocates (signs two versions of one round) is removed the same way, but its
removal carries the evidence, both signed versions (`Equivocation`), so that a member which saw
only one of them can check the offence for itself and sign at once, without waiting.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.peers.crypto import SIGNATURE_BYTES, Context, SignedBatch, parse_public

__all__ = ["MAX_REMOVALS", "Equivocation", "Removal", "quorum", "read_removals"]

_DOMAIN = b"seedflood/removal/1\0"
_BODY = struct.Struct("<QQ")
MAX_REMOVALS = 64
"""Removals one frame may carry: a run loses members one or a few at a time."""
MAX_SIGNERS = 4096
MAX_EVIDENCE_MESSAGES = 4096
"""Messages one version in a piece of evidence may hold: a round's steps, generously."""


def quorum(voters: int) -> int:
    """Signatures a removal needs among ``voters`` members (the removed one not counted): a
    majority, so two removals that disagree cannot both gather one from honest members."""
    return voters // 2 + 1


@dataclass(frozen=True)
class Equivocation:
    """Two versions of one (origin, round) batch, each validly signed by the origin."""

    first: SignedBatch
    second: SignedBatch

    @property
    def origin(self) -> int:
        return self.first.origin

    @property
    def round(self) -> int:
        return self.first.round

    def proves(self, context: Context, key: str | None) -> bool:
        """Whether this is evidence against the holder of ``key`` (hex) in this run: one origin
        and round, two contents, both signatures valid for this run's context."""
        public = parse_public(key) if key else None
        a, b = self.first, self.second
        return (
            public is not None
            and (a.origin, a.round) == (b.origin, b.round)
            and not a.same_content(b)
            and a.verifies(public, context)
            and b.verifies(public, context)
        )

    def to_wire(self) -> list[object]:
        return [self.first.to_json(), self.second.to_json()]


@dataclass(frozen=True)
class Removal:
    """``index`` is gone from ``from_step``; ``signatures`` by signer index, sorted; for an
    equivocator, the ``evidence`` (which the signatures do not cover: it is checked on its own)."""

    index: int
    from_step: int
    signatures: tuple[tuple[int, bytes], ...] = ()
    evidence: Equivocation | None = None

    def signed_bytes(self, context: Context) -> bytes:
        return _DOMAIN + context.encode() + _BODY.pack(self.index, self.from_step)

    def signed(self, key: Ed25519PrivateKey, context: Context, by: int) -> Removal:
        """This removal with member ``by``'s signature added (or replaced)."""
        return self.with_signature(by, key.sign(self.signed_bytes(context)))

    def with_signature(self, by: int, signature: bytes) -> Removal:
        merged = dict(self.signatures)
        merged[by] = signature
        return Removal(self.index, self.from_step, tuple(sorted(merged.items())), self.evidence)

    def merged(self, other: Removal) -> Removal:
        """Both removals' signatures on the same decision (the same index and step)."""
        if (other.index, other.from_step) != (self.index, self.from_step):
            raise ValueError("only signatures of one removal can be merged")
        signatures = {**dict(self.signatures), **dict(other.signatures)}
        evidence = self.evidence or other.evidence
        return Removal(self.index, self.from_step, tuple(sorted(signatures.items())), evidence)

    def signers(self, context: Context, key_of: Callable[[int], str | None]) -> set[int]:
        """The members whose signature verifies under the key ``key_of`` gives (None for one
        that is no member, or no longer one); the removed client never counts."""
        body = self.signed_bytes(context)
        valid = set()
        for by, signature in self.signatures:
            key = key_of(by) if by != self.index else None
            public = parse_public(key) if key else None
            if public is None:
                continue
            try:
                public.verify(signature, body)
            except InvalidSignature:
                continue
            valid.add(by)
        return valid

    def decided(
        self, context: Context, key_of: Callable[[int], str | None], voters: Iterable[int]
    ) -> bool:
        """Whether a majority of ``voters`` (the members expected at the step, removed one
        aside) signed it."""
        electorate = set(voters) - {self.index}
        return len(self.signers(context, key_of) & electorate) >= quorum(len(electorate))

    def to_wire(self) -> list[object]:
        wire: list[object] = [
            self.index,
            self.from_step,
            [[by, base64.b64encode(s).decode()] for by, s in self.signatures],
        ]
        return [*wire, self.evidence.to_wire()] if self.evidence else wire


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _signature(entry: object) -> tuple[int, bytes] | None:
    if not isinstance(entry, list) or len(entry) != 2 or not _count(entry[0]):
        return None
    text = entry[1]
    if not isinstance(text, str) or len(text) > 2 * SIGNATURE_BYTES:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return (entry[0], raw) if len(raw) == SIGNATURE_BYTES else None


def _version(data: object) -> SignedBatch | None:
    if not isinstance(data, dict) or not isinstance(data.get("m"), list):
        return None
    if not 0 < len(data["m"]) <= MAX_EVIDENCE_MESSAGES:
        return None
    try:
        return SignedBatch.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None


def _evidence(entry: object) -> Equivocation | None:
    if not isinstance(entry, list) or len(entry) != 2:
        return None
    first, second = _version(entry[0]), _version(entry[1])
    return Equivocation(first, second) if first and second else None


def _removal(entry: object) -> Removal | None:
    """One removal from a frame header; None for anything an honest peer does not send."""
    if not isinstance(entry, list) or len(entry) not in (3, 4):
        return None
    index, from_step, signatures = entry[:3]
    if not (_count(index) and _count(from_step) and isinstance(signatures, list)):
        return None
    evidence = _evidence(entry[3]) if len(entry) == 4 else None
    if len(entry) == 4 and evidence is None:
        return None
    if not 0 < len(signatures) <= MAX_SIGNERS:
        return None
    parsed = [_signature(s) for s in signatures]
    if any(s is None for s in parsed):
        return None
    removal = Removal(index, from_step, evidence=evidence)
    for by, signature in parsed:
        removal = removal.with_signature(by, signature)
    return removal


def read_removals(value: object) -> tuple[list[Removal], int]:
    """The well-formed removals of a frame header's field, and how many entries were not
    (the caller counts them as rejections)."""
    if value is None:
        return [], 0
    if not isinstance(value, list) or len(value) > MAX_REMOVALS:
        return [], 1
    parsed = [_removal(entry) for entry in value]
    return [r for r in parsed if r is not None], sum(r is None for r in parsed)
