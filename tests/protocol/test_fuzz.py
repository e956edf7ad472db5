"""Every decoder of untrusted bytes, fuzzed: the wire codec, the message log and p2p frames.

The properties: a decoder raises nothing but its own documented error (so a peer's garbage can
never crash another peer), whatever it accepts is canonical and finite (a NaN scalar would poison
every model it reaches), and no declared length or count makes it allocate beyond the bytes that
arrived. 10,500 examples in all, derandomized so that a failure reproduces.
"""

from __future__ import annotations

import math
import struct
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedflood.peers.p2p import MAX_HEADER_BYTES, Frame, TransportError
from seedflood.protocol.message_log import MessageLog, MessageLogError
from seedflood.protocol.messages import (
    MAX_ID,
    PROTOCOL_VERSION,
    SCALAR_FORMATS,
    CodecError,
    Message,
    _put_uvarint,
    decode_packet,
    encode_packet,
)

# Packets of at most ~200 bytes: whatever decoding them allocates beyond this is a length or a
# count believed without checking it against the bytes that arrived.
ALLOCATION_BOUND = 64 * 1024
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def uvarint(value: int) -> bytes:
    out = bytearray()
    _put_uvarint(out, value)  # building hostile input, so the encoder's own varints will do
    return bytes(out)


def decode_checked(data: bytes) -> None:
    """Accept only CodecError or a canonical, finite result; while tracemalloc traces (the
    hostile-fields test), also bound what decoding allocated."""
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    try:
        messages, scalar_format = decode_packet(data)
    except CodecError:
        messages, scalar_format = [], ""
    _, peak = tracemalloc.get_traced_memory()
    assert peak - before < ALLOCATION_BOUND, f"{peak - before} bytes for a {len(data)}-byte input"
    if messages:
        assert all(math.isfinite(m.scalar) for m in messages)
        assert encode_packet(messages, scalar_format) == data


small_or_hostile = st.one_of(
    st.integers(0, 3).map(uvarint),
    st.integers(0, 1 << 14).map(uvarint),
    st.sampled_from([MAX_ID, MAX_ID + 1, 1 << 64, (1 << 70) - 1]).map(uvarint),
    st.sampled_from([b"\x80\x00", b"\xff" * 11, b"\x80"]),  # overlong, too long, truncated
)
# fp32 bytes whose first two also read as an fp16 and whose last two read as a bf16 value.
special_scalars = st.sampled_from(
    [
        struct.pack("<f", math.nan),
        struct.pack("<f", -math.inf),
        b"\x00\x7c\x80\x7f",  # fp16 inf, bf16 inf
        b"\x00\x7e\xc0\x7f",  # fp16 nan, bf16 nan
        struct.pack("<f", 1.5),
        struct.pack("<f", -0.25),
    ]
)


@st.composite
def structured_packets(draw: st.DrawFn) -> bytes:
    """Packets that follow the layout's shape with hostile field values: wrong versions and
    formats, huge and overlong varints, counts far beyond the payload, non-finite scalars."""
    version = draw(st.sampled_from([PROTOCOL_VERSION] * 14 + [0, 2]))
    code = draw(st.sampled_from([0, 1, 2] * 5 + [3, 15]))
    out = bytearray([version * 16 + code]) + draw(small_or_hostile)
    groups = draw(st.integers(1, 3))
    for index in range(groups):
        count = draw(st.one_of(st.integers(0, 3), st.sampled_from([1 << 20, 1 << 40, MAX_ID])))
        has_delta = draw(st.booleans())
        last = index == groups - 1 if draw(st.integers(0, 9)) else draw(st.booleans())
        out += draw(small_or_hostile) + uvarint(min(count * 4 + has_delta * 2 + last, MAX_ID))
        out += draw(small_or_hostile) if has_delta else b""
        size = 4 if code == 0 else 2
        scalar = special_scalars.map(lambda raw, size=size: raw[:size].ljust(size, b"\0"))
        out += b"".join(draw(st.lists(scalar, min_size=min(count, 4), max_size=min(count, 4))))
    if draw(st.integers(0, 9)) == 0:
        out += draw(st.binary(max_size=8))
    return bytes(out)


@st.composite
def valid_packets(draw: st.DrawFn) -> bytes:
    scalar_format = draw(st.sampled_from(SCALAR_FORMATS))
    keys = draw(
        st.lists(st.tuples(st.integers(0, 40), st.integers(0, 300)), min_size=1, max_size=16)
    )
    scalars = st.floats(-1e4, 1e4, allow_nan=False, width=32)
    messages = [Message(step, origin, draw(scalars)) for origin, step in set(keys)]
    return encode_packet(messages, scalar_format)


@settings(FUZZ, max_examples=4000)
@given(
    data=st.one_of(
        st.binary(max_size=96),
        st.binary(max_size=96).map(lambda rest: bytes([PROTOCOL_VERSION * 16]) + rest),
    )
)
@pytest.mark.slow
def test_random_bytes_decode_or_raise_codec_errors(data: bytes) -> None:
    decode_checked(data)


@settings(FUZZ, max_examples=3000)
@given(data=structured_packets())
@pytest.mark.slow
def test_hostile_fields_decode_or_raise_codec_errors(data: bytes) -> None:
    # Traced per example, not per test: tracing hypothesis' own generation costs several times
    # more than starting and stopping around each decode.
    tracemalloc.start()
    try:
        decode_checked(data)
    finally:
        tracemalloc.stop()


@settings(FUZZ, max_examples=1000)
@given(packet=valid_packets(), cut=st.integers(0, 10**6), extra=st.binary(max_size=12))
@pytest.mark.slow
def test_cut_or_extended_packets_are_refused(packet: bytes, cut: int, extra: bytes) -> None:
    """A packet cut anywhere or followed by anything is not a packet: the `last` bit and the
    trailing-bytes check leave no valid prefix or extension."""
    for damaged in (packet[: cut % len(packet)], packet + extra if extra else b""):
        with pytest.raises(CodecError):
            decode_packet(damaged)


def original_log(directory: Path) -> tuple[Path, list[Message]]:
    path = directory / "messages.log"
    messages = [Message(t, o, t - o / 4) for t in range(6) for o in range(3)]
    with MessageLog(path, sync_every=4) as log:
        for start in range(0, len(messages), 4):
            log.append(messages[start : start + 4])
    return path, messages


@settings(FUZZ, max_examples=1000)
@given(
    cut=st.integers(0, 10**6),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    tail=st.one_of(st.just(b""), st.binary(max_size=24), st.integers(1, 64).map(bytes)),
)
@pytest.mark.slow
def test_damaged_logs_read_back_a_prefix_or_refuse(
    tmp_path_factory: pytest.TempPathFactory, cut: int, edits: list[tuple[int, int]], tail: bytes
) -> None:
    """A log cut, overwritten or followed by junk (zeros: what a crash leaves) opens with a
    prefix of what was written or refuses with MessageLogError: never another exception, and
    never a message that was not written."""
    path, messages = original_log(tmp_path_factory.mktemp("log"))
    data = bytearray(path.read_bytes()[: cut % (len(path.read_bytes()) + 1)])
    for position, value in edits:
        if data:
            data[position % len(data)] = value
    path.write_bytes(bytes(data) + tail)
    try:
        kept = MessageLog(path).messages()
    except MessageLogError:
        return
    assert kept == messages[: len(kept)]


@settings(FUZZ, max_examples=250)
@given(records=st.lists(st.binary(max_size=40), min_size=1, max_size=4))
def test_logs_of_checksummed_garbage_are_refused_not_crashed(
    tmp_path_factory: pytest.TempPathFactory, records: list[bytes]
) -> None:
    """Records whose checksums hold but whose payloads are not packets: the CRC passes, so the
    codec is what must refuse them."""
    path = tmp_path_factory.mktemp("log") / "messages.log"
    framed = b"".join(struct.pack("<II", len(r), zlib.crc32(r)) + r for r in records)
    path.write_bytes(framed)
    try:
        log = MessageLog(path)
    except MessageLogError:
        return
    assert [m.key for m in log.messages()] == sorted(m.key for m in log.messages())


json_text = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**6), 10**6),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
).map(lambda value: Frame({"v": value}).encode())
hostile_headers = st.sampled_from(
    [
        b"[" * 50_000,
        b'{"a":' * 50_000,
        b'{"a": NaN}',
        b'{"a": -Infinity}',
        b'{"a": 1e999}',
        b'{"a": ' + b"9" * 5000 + b"}",
        b"\xff\xfe{}",
        b'"just a string"',
        b"{}",
    ]
).map(lambda header: struct.pack("<I", len(header)) + header)


@settings(FUZZ, max_examples=1250)
@given(
    data=st.one_of(
        st.binary(max_size=64),
        json_text,
        hostile_headers,
        st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=32)).map(
            lambda pair: struct.pack("<I", pair[0]) + pair[1]
        ),
    ),
    cut=st.integers(0, 10**6),
)
@pytest.mark.slow
def test_frames_decode_or_raise_transport_errors(data: bytes, cut: int) -> None:
    """Frame.decode on a peer's bytes: deep nesting, non-finite numbers, huge integers and lying
    length fields all end as TransportError; whatever decodes encodes back to the same bytes."""
    for candidate in (data, data[: cut % (len(data) + 1)]):
        try:
            frame = Frame.decode(candidate)
        except TransportError:
            continue
        assert Frame.decode(frame.encode()) == frame


def test_frame_header_size_is_bounded_before_reading_it() -> None:
    declared = struct.pack("<I", MAX_HEADER_BYTES + 1)
    with pytest.raises(TransportError, match=f"at most {MAX_HEADER_BYTES} allowed"):
        Frame.decode(declared + b"{}" + bytes(64))
    with pytest.raises(TransportError, match="nested too deeply"):
        Frame.decode(struct.pack("<I", 100_000) + b"[" * 100_000)
    header = b'{"a":1e999}'
    with pytest.raises(TransportError, match="1e999 is not a finite number"):
        Frame.decode(struct.pack("<I", len(header)) + header)
    with pytest.raises(TransportError, match="bytes, not str"):
        Frame.decode("{}")  # type: ignore[arg-type]
