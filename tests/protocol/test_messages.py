"""The wire codec: canonical round trips, exact sizes, and refusal of every malformed packet."""

import math
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.protocol.messages import (
    MAX_ID,
    PROTOCOL_VERSION,
    SCALAR_BYTES,
    SCALAR_FORMATS,
    CodecError,
    Message,
    decode_packet,
    encode_and_view,
    encode_packet,
    packet_header_bytes,
    quantize,
)

# Largest magnitudes each format holds after rounding, as fp32 values for hypothesis.
_LIMITS = {
    "fp32": float(np.finfo(np.float32).max),
    "fp16": 65504.0,
    "bf16": float(np.float32(3.38e38)),
}


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def canonical(messages: list[Message]) -> list[Message]:
    return sorted(messages, key=lambda m: m.key)


@st.composite
def message_lists(draw: st.DrawFn, scalar_format: str) -> list[Message]:
    """Unique keys, mixing far-apart steps with short runs so that groups of many form."""
    limit = _LIMITS[scalar_format]
    scalar = st.floats(-limit, limit, width=32)
    keys: set[tuple[int, int]] = set()
    for origin, start, length in draw(
        st.lists(
            st.tuples(
                st.integers(0, 2000),
                st.one_of(st.integers(0, 10**7), st.integers(0, 30)),
                st.integers(1, 8),
            ),
            min_size=1,
            max_size=12,
        )
    ):
        keys.update((origin, step) for step in range(start, start + length))
    return [Message(step, origin, draw(scalar)) for origin, step in sorted(keys)]


@pytest.mark.parametrize("scalar_format", SCALAR_FORMATS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
@pytest.mark.slow
def test_round_trip_is_canonical(scalar_format: str, data: st.DataObject) -> None:
    messages = data.draw(message_lists(scalar_format))
    shuffled = data.draw(st.permutations(messages))
    packet = encode_packet(shuffled, scalar_format)
    decoded, decoded_format = decode_packet(packet)
    assert decoded_format == scalar_format
    expected = [Message(m.step, m.origin, quantize(m.scalar, scalar_format)) for m in messages]
    assert decoded == canonical(expected)
    assert encode_packet(decoded, scalar_format) == packet
    # what a simulated network hands its receivers without parsing: the decoded messages, bit
    # for bit (the sign of a zero included)
    same_packet, view = encode_and_view(shuffled, scalar_format)
    assert same_packet == packet
    assert [(m.step, m.origin, struct.pack("<d", m.scalar)) for m in view] == [
        (m.step, m.origin, struct.pack("<d", m.scalar)) for m in decoded
    ]
    assert packet_header_bytes(messages, scalar_format) == (
        len(packet) - len(messages) * SCALAR_BYTES[scalar_format]
    )


@settings(max_examples=60, deadline=None)
@given(messages=message_lists("fp16"))
def test_every_strict_prefix_is_refused(messages: list[Message]) -> None:
    packet = encode_packet(messages, "fp16")
    for end in range(len(packet)):
        with pytest.raises(CodecError):
            decode_packet(packet[:end])


def _assert_only_codec_errors(data: bytes) -> None:
    try:
        messages, scalar_format = decode_packet(data)
    except CodecError:
        return
    assert encode_packet(messages, scalar_format) == data


@settings(max_examples=2500, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=48),
        st.builds(
            lambda fmt, rest: bytes([PROTOCOL_VERSION * 16 + fmt]) + rest,
            st.integers(0, 3),
            st.binary(max_size=48),
        ),
    )
)
def test_arbitrary_bytes_raise_only_codec_errors(data: bytes) -> None:
    _assert_only_codec_errors(data)


@settings(max_examples=250, deadline=None)
@given(
    messages=message_lists("bf16"),
    scalar_format=st.sampled_from(SCALAR_FORMATS),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_corrupted_packets_raise_codec_errors_or_stay_canonical(
    messages: list[Message], scalar_format: str, edits: list[tuple[int, int]]
) -> None:
    if scalar_format == "fp16":
        messages = [Message(m.step, m.origin, max(-1e4, min(1e4, m.scalar))) for m in messages]
    packet = bytearray(encode_packet(messages, scalar_format))
    for position, value in edits:
        packet[position % len(packet)] = value
    _assert_only_codec_errors(bytes(packet))


def test_five_consecutive_steps_cost_25_bytes() -> None:
    messages = [Message(1000 + i, 7, 0.5 * i) for i in range(5)]
    packet = encode_packet(messages, "fp32")
    # head, base_step 1000 (2 bytes), origin_delta 7, tail (count|last, no step_delta), 5 x 4
    assert len(packet) == 1 + 2 + 1 + 1 + 20 == 25
    assert packet[:5] == bytes([PROTOCOL_VERSION * 16 + 0, 0xE8, 0x07, 7, 5 * 4 + 1])
    assert packet[5:] == struct.pack("<5f", *(0.5 * i for i in range(5)))
    assert packet_header_bytes(messages, "fp32") == 5
    assert len(encode_packet(messages, "bf16")) == 15


def test_runs_of_many_origins_share_one_base_step() -> None:
    messages = [Message(step, origin, 1.0) for origin in range(16) for step in (40, 41)]
    packet = encode_packet(messages, "fp16")
    # head + base_step 40, 16 groups of (origin_delta, tail) with no step_delta, 32 fp16 scalars
    assert len(packet) == 2 + 16 * 2 + 32 * 2
    assert packet[:4] == bytes([PROTOCOL_VERSION * 16 + 1, 40, 0, 2 * 4])
    assert decode_packet(packet)[0] == canonical(messages)


def test_a_gap_splits_one_origin_into_two_groups() -> None:
    messages = [Message(step, 3, 2.0) for step in (10, 11, 13)]
    packet = encode_packet(messages, "fp32")
    # head, base_step 10; group (origin_delta 3, tail count 2) + 2 scalars;
    # group (origin_delta 0, tail count 1 | has_step_delta | last, step_delta 3) + 1 scalar
    assert packet == (
        bytes([PROTOCOL_VERSION * 16 + 0, 10, 3, 2 * 4])
        + struct.pack("<2f", 2.0, 2.0)
        + bytes([0, 1 * 4 + 2 + 1, 3])
        + struct.pack("<f", 2.0)
    )
    assert decode_packet(packet)[0] == messages


def test_wrong_version_is_refused() -> None:
    packet = bytearray(encode_packet([Message(0, 0, 1.0)]))
    packet[0] = 2 * 16 + 0
    with pytest.raises(CodecError, match="version 2 at byte 0"):
        decode_packet(bytes(packet))


def test_unknown_format_is_refused() -> None:
    with pytest.raises(CodecError, match="format code 3 at byte 0"):
        decode_packet(bytes([0x13, 0, 0, 1 * 4 + 1, 0, 0]))


def test_huge_count_is_refused_without_allocating() -> None:
    packet = bytes([0x10]) + uvarint(0) + uvarint(0) + uvarint(10**9 * 4 + 1)
    packet += bytes(8)
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match=r"count 1000000000, but only 2 scalars fit"):
            decode_packet(packet)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000


@pytest.mark.parametrize(
    ("packet", "problem"),
    [
        (b"", "empty packet: it needs at least a version byte"),
        (bytes([0x10]), r"truncated varint \(base_step\) at byte 1"),
        (bytes([0x10, 0]), "ends at byte 2 before its last group"),
        (bytes([0x10, 0x80, 0]), r"overlong varint \(base_step\) at byte 1"),
        (bytes([0x10]) + bytes([0xFF] * 10) + b"\x01", "longer than 10 bytes"),
        (bytes([0x10]) + uvarint(1 << 63), "beyond 2\\^63 - 1"),
        (bytes([0x10, 0, 0, 1]), "byte 2 has count 0"),
        (bytes([0x10, 0, 0, 5, 0, 0]), "only 0 scalars fit"),
        (bytes([0x10, 0, 0, 7]), r"truncated varint \(step_delta\) at byte 4"),
        (
            bytes([0x10, 0, 0, 7, 0]) + struct.pack("<f", 1.0),
            "group at byte 2 writes a step_delta of 0",
        ),
        (bytes([0x10, 5, 0, 7, 1]) + struct.pack("<f", 1.0), "base_step 5 at byte 1"),
        (
            bytes([0x10, 0, 0, 5]) + struct.pack("<f", math.nan),
            "non-finite scalar nan at byte 4",
        ),
        (bytes([0x11, 0, 0, 9, 0, 0, 0, 0x7C]), "non-finite scalar inf at byte 6"),
        (bytes([0x12, 0, 0, 5, 0xC0, 0x7F]), "non-finite scalar nan at byte 4"),
        (bytes([0x12, 0, 0, 5, 0x80, 0xFF]), "non-finite scalar -inf at byte 4"),
        (bytes([0x10, 0, 0, 4, 0, 0, 0, 0]), "ends at byte 8 before its last group"),
        (bytes([0x12, 0, 0, 5, 0, 0, 9]), "1 trailing bytes after the last group at byte 6"),
        (bytes([0x12, 0, 0, 4, 0, 0, 0, 5, 0, 0]), "duplicate"),
        (bytes([0x12, 0, 0, 4, 0, 0, 0, 7, 1, 0, 0]), "continues the previous group"),
        (bytes([0x12, 0, 0, 6, 3, 0, 0, 0, 5, 0, 0]), "precedes the previous group"),
        (bytes([0x12]) + uvarint(MAX_ID) + bytes([0, 9, 0, 0, 0, 0]), "overflows"),
        (
            bytes([0x12, 0]) + uvarint(MAX_ID) + bytes([11]) + uvarint(MAX_ID) + bytes(4),
            "overflows",
        ),
        (
            bytes([0x12, 0]) + uvarint(MAX_ID) + bytes([4, 0, 0, 1, 5, 0, 0]),
            "overflows",
        ),
    ],
)
def test_malformed_packets_name_the_problem(packet: bytes, problem: str) -> None:
    with pytest.raises(CodecError, match=problem):
        decode_packet(packet)


def test_decode_refuses_non_bytes() -> None:
    with pytest.raises(CodecError, match="bytes, not int"):
        decode_packet(7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([], "at least one message"),
        ([Message(3, 1, 1.0), Message(3, 1, 2.0)], "duplicate message"),
        ([Message(-1, 0, 1.0)], "step -1 is outside"),
        ([Message(0, -2, 1.0)], "origin -2 is outside"),
        ([Message(MAX_ID + 1, 0, 1.0)], "outside"),
        ([Message(0, 0, math.nan)], "not finite"),
        ([Message(0, 0, math.inf)], "not finite"),
        ([Message(0, 0, "1.0")], "not a real number"),  # type: ignore[arg-type]
        ([Message(0.5, 0, 1.0)], "step 0.5 is not an integer"),  # type: ignore[arg-type]
    ],
)
def test_encode_refuses_bad_messages(messages: list[Message], problem: str) -> None:
    with pytest.raises(CodecError, match=problem):
        encode_packet(messages)


def test_unknown_format_name_is_refused() -> None:
    with pytest.raises(CodecError, match="'fp8' is not one of fp32, fp16, bf16"):
        encode_packet([Message(0, 0, 1.0)], "fp8")


def test_message_sorts_canonically_by_step_then_origin() -> None:
    messages = [Message(2, 0, 0.0), Message(1, 5, 0.0), Message(1, 3, 0.0)]
    assert [m.key for m in sorted(messages)] == [(1, 3), (1, 5), (2, 0)]


@settings(max_examples=300, deadline=None)
@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_quantize_matches_numpy(value: float) -> None:
    with np.errstate(over="ignore"):
        as_fp32, as_fp16 = np.float32(value), np.float16(value)
    for name, expected in (("fp32", as_fp32), ("fp16", as_fp16)):
        if np.isinf(expected):
            with pytest.raises(CodecError, match=f"beyond the {name} range"):
                quantize(value, name)
        else:
            result = quantize(value, name)
            assert result == float(expected)
            assert math.copysign(1.0, result) == math.copysign(1.0, float(expected))


@settings(max_examples=300, deadline=None)
@given(value=st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_bf16_rounds_to_nearest_even(value: float) -> None:
    bits = int(np.float32(value).view(np.uint32))
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    expected = float(np.uint32(rounded).view(np.float32))
    if math.isinf(expected):
        with pytest.raises(CodecError, match="beyond the bf16 range"):
            quantize(value, "bf16")
    else:
        assert quantize(value, "bf16") == expected


def test_bf16_known_values() -> None:
    assert quantize(1.0, "bf16") == 1.0
    assert quantize(1.00390625, "bf16") == 1.0  # 1 + 2^-8 is a tie: to even, down
    assert quantize(1.01171875, "bf16") == 1.015625  # 1 + 3 * 2^-8 is a tie: to even, up
    assert quantize(1.00390625 + 2**-30, "bf16") == 1.0078125  # above the tie: rounds once, up
    assert quantize(-(2.0**-140), "bf16") == -0.0
    assert math.copysign(1.0, quantize(-(2.0**-140), "bf16")) == -1.0
    assert quantize(2.0**-133, "bf16") == 2.0**-133  # the smallest subnormal survives


def test_range_limits_raise_instead_of_overflowing() -> None:
    assert quantize(65504.0, "fp16") == 65504.0
    assert quantize(65519.0, "fp16") == 65504.0
    with pytest.raises(CodecError, match="beyond the fp16 range"):
        quantize(65520.0, "fp16")
    with pytest.raises(CodecError, match="beyond the fp16 range"):
        encode_packet([Message(0, 0, -1e5)], "fp16")
    with pytest.raises(CodecError, match="beyond the fp32 range"):
        quantize(1e39, "fp32")
    with pytest.raises(CodecError, match="beyond the bf16 range"):
        quantize(3.4e38, "bf16")


def test_decoded_scalars_equal_what_the_sender_applies() -> None:
    messages = [Message(0, origin, 0.1 * (origin + 1)) for origin in range(4)]
    for scalar_format in SCALAR_FORMATS:
        decoded, _ = decode_packet(encode_packet(messages, scalar_format))
        assert [m.scalar for m in decoded] == [quantize(m.scalar, scalar_format) for m in messages]
    assert quantize(0.1, "fp16") == 0.0999755859375
