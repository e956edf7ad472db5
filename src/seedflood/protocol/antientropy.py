"""Anti-entropy: neighbours compare compact digests of what they hold and pull what is missing.

Flooding forwards each message once per edge, so a lost packet leaves everyone behind it without
the message for good, and a cut leaves each side without the other's. Anti-entropy closes those
holes: every client sends each neighbour a digest of the message ids it holds; the neighbour
answers with the messages it holds that the digest lacks. Digests and repairs travel the same
(possibly faulty) links as flood packets, and their bytes are counted apart, so what reliability
costs is visible next to what flooding costs.

A client holds, for each origin, nearly always one unbroken run of steps from 0, so a digest
stores per origin the first step it lacks and a bitmap of the steps it holds beyond that
(the holes a loss leaves are few and recent). Layout, version 1 (uvarint = unsigned LEB128)::

    digest := version:u8  origins:uvarint  base:uvarint  row[origins]
    row    := delta:uvarint  gap_bytes:uvarint  gap[gap_bytes]

- Row o is origin o: it holds every step below ``base + delta`` (its first missing step), and
  step ``base + delta + 1 + i`` exactly when bit i of the little-endian bitmap ``gap`` is set.
- base is the smallest first missing step, so some row has delta 0; ``gap`` has no trailing zero
  byte. A digest has one encoding and `decode_digest` refuses any other.

Sixteen origins in step with each other cost 2 + 2 + 16 · 2 = 36 bytes at any step from 128
to 16,383.

Only messages that fault-free flooding would already have delivered are repaired: with fewer
hops per round than the diameter, anti-entropy must not deliver recent messages early, or the
clients' models would differ from the fault-free run's. This module is the digest format; the
simulator's repair driver is `seedflood.sim.repair`, the real peers' pull is in
`seedflood.peers.batch_exchange`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from seedflood.protocol.flooding import FloodState, origins
from seedflood.protocol.messages import (
    MAX_ID,
    CodecError,
    Message,
    _get_uvarint,
    _put_uvarint,
)

DIGEST_VERSION = 1
MAX_DIGEST_ORIGINS = 1 << 20
"""Origins a digest may list: beyond any network this simulator or a peer runs."""
MAX_GAP_BYTES = 1 << 16
"""Bitmap bytes per origin: 524,288 steps past a hole, far beyond any staleness worth repairing."""

Pending = Mapping[int, Mapping[int, Message]]
"""Messages not yet held by everyone: step → origin → message."""


@dataclass(frozen=True)
class Digest:
    """What one client holds. Per origin o: every step below ``first_missing[o]`` is held, that
    step is not, and step ``first_missing[o] + 1 + i`` is held exactly when bit i of
    ``gaps[o]`` is set."""

    first_missing: tuple[int, ...]
    gaps: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.first_missing) != len(self.gaps):
            raise ValueError(
                f"a digest has one gap bitmap per origin: {len(self.first_missing)} origins, "
                f"{len(self.gaps)} bitmaps"
            )
        if any(not 0 <= s <= MAX_ID for s in self.first_missing) or any(g < 0 for g in self.gaps):
            raise ValueError("digest steps must be in 0 .. 2^63 - 1 and bitmaps non-negative")

    def holds(self, step: int, origin: int) -> bool:
        """Whether ``origin``'s message of ``step`` is held: one origin's row, not every row."""
        if not 0 <= origin < len(self.first_missing):
            return False
        first = self.first_missing[origin]
        return step < first or (step > first and bool(self.gaps[origin] >> (step - first - 1) & 1))

    def held(self, step: int) -> int:
        """The origins whose message of ``step`` is held, as a bitmask."""
        mask = 0
        for origin, (first, gaps) in enumerate(zip(self.first_missing, self.gaps, strict=True)):
            if step < first or (step > first and gaps >> (step - first - 1) & 1):
                mask |= 1 << origin
        return mask


def digest_of(state: FloodState, count: int) -> Digest:
    """The digest of what ``state`` holds from origins ``0 .. count - 1``."""
    return digest_from(state.watermark, state.tracked_steps(), state.held, count)


def digest_of_pending(committed_step: int, pending: Pending, count: int) -> Digest:
    """The digest of a real peer: every step up to ``committed_step``, then what it holds, within
    what the format can say. Steps too far past the first missing one for a gap bitmap, and
    origins beyond the most a digest lists, are left out: the digest then understates what is
    held, which costs a neighbour a resend, never a message."""
    horizon = committed_step + 1 + 8 * MAX_GAP_BYTES
    return digest_from(
        committed_step + 1,
        sorted(step for step in pending if step <= horizon),
        lambda step: sum(1 << origin for origin in pending.get(step, {})),
        min(count, MAX_DIGEST_ORIGINS),
    )


def digest_from(
    watermark: int, steps: Sequence[int], held: Callable[[int], int], count: int
) -> Digest:
    """Everything below ``watermark`` is held; ``held(step)`` is the origin bitmask of each of
    ``steps`` (ascending, at or above the watermark)."""
    first_missing = [watermark] * count
    unbroken, expected = (1 << count) - 1, watermark
    for step in steps:
        if step != expected:
            break
        holders = held(step)
        for origin in origins(unbroken & ~holders):
            first_missing[origin] = step
        unbroken &= holders
        if not unbroken:
            break
        expected = step + 1
    for origin in origins(unbroken):
        first_missing[origin] = expected
    gaps = [0] * count
    for step in steps:
        for origin in origins(held(step) & ((1 << count) - 1)):
            if step > first_missing[origin]:
                gaps[origin] |= 1 << (step - first_missing[origin] - 1)
    return Digest(tuple(first_missing), tuple(gaps))


def encode_digest(digest: Digest) -> bytes:
    out = bytearray((DIGEST_VERSION,))
    count = len(digest.first_missing)
    if count > MAX_DIGEST_ORIGINS:
        raise CodecError(f"a digest lists at most {MAX_DIGEST_ORIGINS} origins, not {count}")
    base = min(digest.first_missing, default=0)
    _put_uvarint(out, count)
    _put_uvarint(out, base)
    for first, gaps in zip(digest.first_missing, digest.gaps, strict=True):
        bitmap = gaps.to_bytes((gaps.bit_length() + 7) // 8, "little")
        if len(bitmap) > MAX_GAP_BYTES:
            raise CodecError(f"a gap bitmap of {len(bitmap)} bytes exceeds {MAX_GAP_BYTES}")
        _put_uvarint(out, first - base)
        _put_uvarint(out, len(bitmap))
        out += bitmap
    return bytes(out)


def decode_digest(data: bytes) -> Digest:
    """The digest in ``data``, or a CodecError (a ValueError) naming what is wrong and where.
    Nothing is allocated beyond what ``data`` itself holds."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"a digest is bytes, not {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise CodecError("empty digest: it needs at least a version byte")
    if data[0] != DIGEST_VERSION:
        raise CodecError(f"unsupported digest version {data[0]} at byte 0 (reads {DIGEST_VERSION})")
    count, pos = _get_uvarint(data, 1, "origins")
    if count > MAX_DIGEST_ORIGINS:
        raise CodecError(f"digest lists {count} origins, more than {MAX_DIGEST_ORIGINS}")
    base, pos = _get_uvarint(data, pos, "base")
    if 2 * count > len(data) - pos:
        raise CodecError(
            f"digest lists {count} origins but only {len(data) - pos} bytes follow (2 per origin)"
        )
    if count == 0 and base != 0:
        raise CodecError(f"digest without origins has base {base}, not 0 (not canonical)")
    first_missing: list[int] = []
    gaps: list[int] = []
    for origin in range(count):
        at = pos
        delta, pos = _get_uvarint(data, pos, "delta")
        size, pos = _get_uvarint(data, pos, "gap_bytes")
        if size > MAX_GAP_BYTES or size > len(data) - pos:
            raise CodecError(
                f"origin {origin} at byte {at}: gap of {size} bytes, but at most "
                f"{min(MAX_GAP_BYTES, len(data) - pos)} fit"
            )
        bitmap = data[pos : pos + size]
        if size and bitmap[-1] == 0:
            raise CodecError(f"origin {origin} at byte {at}: gap ends in a zero byte")
        if base + delta + 8 * size > MAX_ID:
            raise CodecError(f"origin {origin} at byte {at}: steps run beyond 2^63 - 1")
        first_missing.append(base + delta)
        gaps.append(int.from_bytes(bitmap, "little"))
        pos += size
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes after the last origin at byte {pos}")
    if count and min(first_missing) != base:
        raise CodecError(f"base {base} at byte 1 is not the smallest first missing step")
    return Digest(tuple(first_missing), tuple(gaps))
