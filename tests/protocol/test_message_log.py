"""The message log gives back exactly what was synced, survives torn writes, refuses damage."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.protocol.message_log import MAX_RECORD_BYTES, MessageLog, MessageLogError
from seedflood.protocol.messages import Message, encode_packet


def committed(steps: int, origins: int) -> list[Message]:
    return [
        Message(t, o, (t * origins + o) / 8 - 3.0) for t in range(steps) for o in range(origins)
    ]


def test_reopened_log_holds_what_was_synced_in_order(tmp_path: Path) -> None:
    path = tmp_path / "peer" / "messages.log"
    messages = committed(10, 4)
    with MessageLog(path, sync_every=8) as log:
        log.append(messages[:5])
        assert log.synced == 0
        log.append(messages[5:10])
        assert log.synced == 10
        log.append(messages[10:])
    reopened = MessageLog(path)
    assert reopened.messages() == messages and len(reopened) == 40
    assert reopened.messages(37) == messages[37:]
    reopened.append([Message(10, 0, 1.5)])
    reopened.close()
    assert MessageLog(path).messages() == [*messages, Message(10, 0, 1.5)]


def test_a_crash_loses_only_what_was_not_synced(tmp_path: Path) -> None:
    path = tmp_path / "messages.log"
    log = MessageLog(path, sync_every=5)
    messages = committed(3, 4)
    log.append(messages)
    assert log.synced == 12
    log.append([Message(3, 0, 0.25), Message(3, 1, 0.5)])
    # no sync and no close: the process dies here
    assert MessageLog(path).messages() == messages


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_any_torn_tail_reads_back_as_a_prefix_and_appends_continue(
    tmp_path_factory: pytest.TempPathFactory, cut: int
) -> None:
    path = tmp_path_factory.mktemp("torn") / "messages.log"
    messages = committed(6, 3)
    with MessageLog(path, sync_every=4) as log:
        for start in range(0, len(messages), 3):
            log.append(messages[start : start + 3])
    data = path.read_bytes()
    path.write_bytes(data[: cut % (len(data) + 1)])
    recovered = MessageLog(path)
    kept = recovered.messages()
    assert kept == messages[: len(kept)]
    recovered.append(messages[len(kept) :])
    recovered.close()
    assert MessageLog(path).messages() == messages


def test_damage_in_the_middle_is_refused_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "messages.log"
    with MessageLog(path, sync_every=1) as log:
        for message in committed(4, 2):
            log.append([message])
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(MessageLogError, match="record at byte 0 fails its checksum"):
        MessageLog(path)


def test_appends_must_keep_canonical_order_and_carried_scalars(tmp_path: Path) -> None:
    log = MessageLog(tmp_path / "messages.log", scalar_format="bf16")
    log.append([Message(2, 1, 0.5)])
    with pytest.raises(MessageLogError, match=r"message \(2, 0\) appended after \(2, 1\)"):
        log.append([Message(2, 0, 0.5)])
    with pytest.raises(MessageLogError, match="bf16 cannot hold exactly"):
        log.append([Message(3, 0, 0.1)])
    with pytest.raises(ValueError, match="sync_every must be at least 1"):
        MessageLog(tmp_path / "other.log", sync_every=0)


def test_zeros_a_crash_left_at_the_end_are_a_torn_tail(tmp_path: Path) -> None:
    """A crash after the file grew but before its data reached the disk leaves zeros: no record
    is empty, so they are dropped like any torn tail, and the file is cut back to the records."""
    path = tmp_path / "messages.log"
    with MessageLog(path, sync_every=1) as log:
        log.append(committed(2, 2))
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + bytes(4096))
    assert MessageLog(path).messages() == committed(2, 2)
    assert path.stat().st_size == size


def test_zeros_followed_by_data_are_damage(tmp_path: Path) -> None:
    path = tmp_path / "messages.log"
    with MessageLog(path, sync_every=1) as log:
        log.append(committed(1, 1))
    path.write_bytes(path.read_bytes() + bytes(16) + b"\x01")
    with pytest.raises(MessageLogError, match="empty packet"):
        MessageLog(path)


def test_a_length_no_writer_produces_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "messages.log"
    with MessageLog(path, sync_every=1) as log:
        log.append(committed(1, 2))
    data = path.read_bytes()
    path.write_bytes(data + struct.pack("<II", MAX_RECORD_BYTES + 1, 0) + bytes(8))
    with pytest.raises(
        MessageLogError, match=rf"record at byte {len(data)} declares {MAX_RECORD_BYTES + 1} bytes"
    ):
        MessageLog(path)
    assert path.read_bytes()[: len(data)] == data


def test_records_out_of_canonical_order_are_refused(tmp_path: Path) -> None:
    """Checksums hold record by record; only the order across records shows the splice. The
    first record is an 8-byte frame and an 8-byte packet, so the second starts at byte 16."""
    path = tmp_path / "messages.log"
    records = [encode_packet([Message(5, 0, 1.0)]), encode_packet([Message(4, 1, 1.0)])]
    path.write_bytes(b"".join(struct.pack("<II", len(r), zlib.crc32(r)) + r for r in records))
    with pytest.raises(
        MessageLogError, match=r"record at byte 16 starts at message \(4, 1\), not after \(5, 0\)"
    ):
        MessageLog(path)
