"""SeedFlood messages and their binary, versioned wire codec.

A zeroth-order update is fully described by (origin, step, scalar): the direction is regenerated
from (run_seed, origin, step), so the scalar is the only real payload. Flooding moves runs of
consecutive steps from the same origins, so the codec spends a few varints per run, not per
message, and the wire cost approaches the scalar size (4 or 2 bytes) per message.

Layout, version 1 (uvarint = unsigned LEB128)::

    packet := head:u8  base_step:uvarint  group+               (groups until the end)
    head   := version * 16 + format
    group  := origin_delta:uvarint  tail:uvarint  [step_delta:uvarint]  scalar[count]
    tail   := count * 4 + has_step_delta * 2 + last  (last = 1 on the final group, else 0)

- Messages are sorted by (origin, step); a group holds `count` messages of one origin with the
  consecutive steps first_step .. first_step + count - 1.
- base_step is the smallest step in the packet; step_delta = first_step - base_step, written
  only when it is not 0 (has_step_delta = 1), so the common group of one origin's steps of this
  round costs two bytes.
- origin_delta = origin - previous group's origin (origin - 0 for the first group). A later group
  of the same origin (origin_delta 0) starts at least two steps after the previous group's last
  step: adjacent runs are one group.
- The `last` bit marks the final group, so a packet cut at a group boundary is detected as
  truncated; for the same reason a packet holds at least one message.
- version is 1; format selects the scalar: 0 = fp32, 1 = fp16, 2 = bf16 (the top two bytes of a
  float32), all little-endian. Scalars are finite.
- uvarints are minimal (no trailing 0x00 continuation) and below 2^63; origins and steps too.

One origin's five steps in fp32 cost 1 + 2 + 1 + 1 + 20 = 25 bytes: 5 bytes per message, the
paper's figure (its 400 KB per edge for a 16-client ring over 5,000 steps).

Every valid packet has exactly one encoding and the decoder rejects everything else, so
``encode_packet(*decode_packet(p)) == p``: peers can hash, deduplicate and log packets as bytes.
"""

import math
import numbers
import operator
import struct
from collections.abc import Iterable
from dataclasses import dataclass

PROTOCOL_VERSION: int = 1
SCALAR_FORMATS: tuple[str, ...] = ("fp32", "fp16", "bf16")
SCALAR_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
MAX_MESSAGES_PER_PACKET: int = 1 << 20
MAX_ID: int = (1 << 63) - 1

_BF16_MAX = math.ldexp(255 / 128, 127)


class CodecError(ValueError):
    """Anything the codec refuses. A ValueError, so input checks catch it with the rest; the text
    names the problem and, when decoding, its byte offset."""


@dataclass(frozen=True, order=True, slots=True)
class Message:
    """One zeroth-order update. Field order makes plain sorting canonical: by (step, origin)."""

    step: int
    origin: int
    scalar: float

    @property
    def key(self) -> tuple[int, int]:
        """The identity flooding deduplicates on: a scalar never distinguishes two messages."""
        return (self.step, self.origin)


def _format_code(scalar_format: str) -> int:
    try:
        return SCALAR_FORMATS.index(scalar_format)
    except ValueError:
        raise CodecError(
            f"scalar_format {scalar_format!r} is not one of {', '.join(SCALAR_FORMATS)}"
        ) from None


def _round_bf16(value: float) -> float:
    # Round once, from the float64 value: going through float32 first would round ties twice.
    _, exponent = math.frexp(value)
    quantum = max(exponent - 1, -126) - 7
    rounded = math.copysign(math.ldexp(round(math.ldexp(value, -quantum)), quantum), value)
    if abs(rounded) > _BF16_MAX:
        raise CodecError(f"scalar {value!r} is beyond the bf16 range")
    return rounded


def quantize(scalar: float, scalar_format: str) -> float:
    """The value every client applies for `scalar`, the sender included, so that all agree.

    Rounding is to nearest, ties to even. Values that would become infinite raise instead: an
    update silently turned into inf would destroy every model it reaches.
    """
    _format_code(scalar_format)
    if not isinstance(scalar, numbers.Real):
        raise CodecError(f"scalar {scalar!r} is not a real number")
    value = float(scalar)
    if not math.isfinite(value):
        raise CodecError(f"scalar {value!r} is not finite")
    if scalar_format == "bf16":
        return _round_bf16(value)
    code = "<f" if scalar_format == "fp32" else "<e"
    try:
        return struct.unpack(code, struct.pack(code, value))[0]
    except OverflowError:
        raise CodecError(f"scalar {value!r} is beyond the {scalar_format} range") from None


LARGEST: dict[str, float] = {"fp32": 3.4028234663852886e38, "fp16": 65504.0, "bf16": _BF16_MAX}
"""The largest finite magnitude each scalar format carries."""


def saturate(scalar: float, scalar_format: str) -> tuple[float, bool]:
    """What an originator floods for its estimate, and whether it had to be clamped: the value
    quantized, or ± the format's largest finite value where it is beyond the format's range.
    Clamping happens once, before the message leaves, so every client applies the same value and
    an honest overflow (or an attacker's) never stops a run; a NaN estimate still raises, since
    no value stands for it."""
    value = float(scalar)
    if math.isnan(value):
        raise CodecError("scalar nan is not a number: the loss was not finite")
    largest = LARGEST[scalar_format]
    if abs(value) > largest:
        return math.copysign(largest, value), True
    return quantize(value, scalar_format), False


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_uvarint(data: bytes, pos: int, field: str) -> tuple[int, int]:
    start, value, shift = pos, 0, 0
    while True:
        if pos >= len(data):
            raise CodecError(f"truncated varint ({field}) at byte {start}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift >= 70:
            raise CodecError(f"varint ({field}) at byte {start} is longer than 10 bytes")
    if byte == 0 and pos - start > 1:
        raise CodecError(f"overlong varint ({field}) at byte {start}")
    if value > MAX_ID:
        raise CodecError(f"varint ({field}) at byte {start} is {value}, beyond 2^63 - 1")
    return value, pos


def _pack_scalars(values: list[float], scalar_format: str) -> bytes:
    n = len(values)
    if scalar_format == "fp16":
        return struct.pack(f"<{n}e", *values)
    raw = struct.pack(f"<{n}f", *values)
    if scalar_format == "fp32":
        return raw
    out = bytearray(2 * n)
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def _unpack_scalars(data: bytes, pos: int, n: int, scalar_format: str) -> tuple[float, ...]:
    if scalar_format == "fp16":
        return struct.unpack_from(f"<{n}e", data, pos)
    if scalar_format == "fp32":
        return struct.unpack_from(f"<{n}f", data, pos)
    raw = bytearray(4 * n)
    raw[2::4] = data[pos : pos + 2 * n : 2]
    raw[3::4] = data[pos + 1 : pos + 2 * n : 2]
    return struct.unpack(f"<{n}f", raw)


def _check_id(value: object, name: str) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        raise CodecError(f"{name} {value!r} is not an integer") from None
    if not 0 <= number <= MAX_ID:
        raise CodecError(f"{name} {number} is outside 0 .. 2^63 - 1")
    return number


def encode_packet(messages: Iterable[Message], scalar_format: str = "fp32") -> bytes:
    """Pack messages into one canonical packet; the input order does not matter."""
    return _encode(messages, scalar_format)[0]


def encode_and_view(
    messages: Iterable[Message], scalar_format: str = "fp32"
) -> tuple[bytes, list[Message]]:
    """The packet, and the messages `decode_packet` reads from it (canonical order, scalars as
    they travel), built from the values just packed instead of parsed back: a simulated network
    hands its receivers what the wire carries without parsing every packet it made itself, a
    million messages a round at 1,024 clients with hops = 1."""
    packet, items, values = _encode(messages, scalar_format)
    view = [
        Message(step, origin, value) for (origin, step, _), value in zip(items, values, strict=True)
    ]
    view.sort()
    return packet, view


def _encode(
    messages: Iterable[Message], scalar_format: str
) -> tuple[bytes, list[tuple[int, int, float]], list[float]]:
    """The packet, with the (origin, step, scalar) items it packs in packing order and their
    scalars as they travel."""
    code = _format_code(scalar_format)
    items = sorted(
        ((_check_id(m.origin, "origin"), _check_id(m.step, "step"), m.scalar) for m in messages),
        key=operator.itemgetter(0, 1),
    )
    if not items:
        raise CodecError("a packet holds at least one message")
    if len(items) > MAX_MESSAGES_PER_PACKET:
        raise CodecError(f"{len(items)} messages exceed {MAX_MESSAGES_PER_PACKET} per packet")
    runs: list[list[int]] = []
    for origin, step, _ in items:
        if runs and runs[-1][0] == origin:
            last = runs[-1][1] + runs[-1][2] - 1
            if step == last:
                raise CodecError(f"duplicate message (origin {origin}, step {step})")
            if step == last + 1:
                runs[-1][2] += 1
                continue
        runs.append([origin, step, 1])
    values = [quantize(scalar, scalar_format) for _, _, scalar in items]
    base = min(first for _, first, _ in runs)
    out = bytearray((PROTOCOL_VERSION * 16 + code,))
    _put_uvarint(out, base)
    previous_origin = taken = 0
    for index, (origin, first, count) in enumerate(runs):
        _put_uvarint(out, origin - previous_origin)
        _put_uvarint(out, count * 4 + (first != base) * 2 + (index == len(runs) - 1))
        if first != base:
            _put_uvarint(out, first - base)
        out += _pack_scalars(values[taken : taken + count], scalar_format)
        previous_origin, taken = origin, taken + count
    return bytes(out), items, values


def decode_packet(data: bytes) -> tuple[list[Message], str]:
    """Messages in canonical (step, origin) order, and the scalar format they travelled in."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"a packet is bytes, not {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise CodecError("empty packet: it needs at least a version byte")
    version, code = divmod(data[0], 16)
    if version != PROTOCOL_VERSION:
        raise CodecError(
            f"unsupported protocol version {version} at byte 0 (reads {PROTOCOL_VERSION})"
        )
    if code >= len(SCALAR_FORMATS):
        raise CodecError(f"unknown scalar format code {code} at byte 0")
    scalar_format = SCALAR_FORMATS[code]
    size = SCALAR_BYTES[scalar_format]
    base, pos = _get_uvarint(data, 1, "base_step")
    messages: list[Message] = []
    origin, previous_first, previous_last, smallest_delta, last = 0, 0, 0, MAX_ID, False
    while not last:
        at = pos
        if at == len(data):
            raise CodecError(f"truncated packet: it ends at byte {at} before its last group")
        origin_delta, pos = _get_uvarint(data, pos, "origin_delta")
        tail, pos = _get_uvarint(data, pos, "count")
        count, has_step_delta, last = tail >> 2, bool(tail & 2), bool(tail & 1)
        step_delta = 0
        if has_step_delta:
            step_delta, pos = _get_uvarint(data, pos, "step_delta")
            if step_delta == 0:
                raise CodecError(f"group at byte {at} writes a step_delta of 0 (not canonical)")
        if count == 0:
            raise CodecError(f"group at byte {at} has count 0")
        room = (len(data) - pos) // size
        if count > room:
            raise CodecError(f"group at byte {at} has count {count}, but only {room} scalars fit")
        if len(messages) + count > MAX_MESSAGES_PER_PACKET:
            raise CodecError(f"group at byte {at} exceeds {MAX_MESSAGES_PER_PACKET} messages")
        origin += origin_delta
        first = base + step_delta
        if origin > MAX_ID or first + count - 1 > MAX_ID:
            raise CodecError(f"group at byte {at} overflows origin or step beyond 2^63 - 1")
        if messages and origin_delta == 0 and step_delta <= previous_last + 1:
            if step_delta == previous_last + 1:
                problem = "continues the previous group (not canonical)"
            elif step_delta + count - 1 >= previous_first:
                problem = "repeats a step of the previous group: duplicate (origin, step)"
            else:
                problem = "precedes the previous group (not canonical)"
            raise CodecError(f"group at byte {at} of origin {origin} {problem}")
        values = _unpack_scalars(data, pos, count, scalar_format)
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise CodecError(f"non-finite scalar {value} at byte {pos + i * size}")
            messages.append(Message(first + i, origin, value))
        pos += count * size
        previous_first, previous_last = step_delta, step_delta + count - 1
        smallest_delta = min(smallest_delta, step_delta)
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes after the last group at byte {pos}")
    if smallest_delta != 0:
        raise CodecError(f"base_step {base} at byte 1 is not the smallest step in the packet")
    messages.sort(key=operator.attrgetter("key"))
    return messages, scalar_format


def packet_header_bytes(messages: Iterable[Message], scalar_format: str) -> int:
    """Bytes of a packet that are not scalar payload: what the protocol costs beyond the updates."""
    items = list(messages)
    return len(encode_packet(items, scalar_format)) - len(items) * SCALAR_BYTES[scalar_format]
