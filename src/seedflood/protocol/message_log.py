"""An append-only, crash-safe log of the messages a peer has committed.

A SeedFlood model at any step is the initial model plus every committed message applied in
canonical (step, origin) order, so a peer's log *is* its model: after a crash it replays the log
and loses nothing, and a peer that joins late replays a neighbour's log (or a snapshot plus the
log's tail). Records are codec packets framed by their length and CRC-32. Appends are buffered and
fsync'd in batches; a record cut short by a crash at the end of the file is dropped on open, so
what is read back is always a prefix of what was appended, while damage in the middle of the file
is refused loudly instead of silently losing every later record.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from seedflood.files import atomic_write_bytes
from seedflood.protocol.messages import (
    MAX_MESSAGES_PER_PACKET,
    CodecError,
    Message,
    decode_packet,
    encode_packet,
    quantize,
)

_FRAME = struct.Struct("<II")
# The longest packet the log writes: a version byte, a base step, and per message at most three
# 10-byte varints and a 4-byte scalar. A longer length field is damage, never a torn write.
MAX_RECORD_BYTES = 11 + MAX_MESSAGES_PER_PACKET * 34


class MessageLogError(ValueError):
    """A log that cannot be trusted or an append that would break its order."""


def _records(data: bytes, path: Path) -> Iterator[tuple[int, list[Message]]]:
    """(end offset, messages) of every whole record; stops quietly at a torn tail."""
    offset, last = 0, None
    while offset < len(data):
        if offset + _FRAME.size > len(data):
            return
        length, checksum = _FRAME.unpack_from(data, offset)
        # No record is empty: zeros to the end are where a crash left the file longer than what
        # reached the disk, a torn tail like any other.
        if length == 0 and data.count(0, offset) == len(data) - offset:
            return
        if length > MAX_RECORD_BYTES:
            raise MessageLogError(
                f"{path}: record at byte {offset} declares {length} bytes, more than any record "
                f"holds ({MAX_RECORD_BYTES}): the log is damaged"
            )
        end = offset + _FRAME.size + length
        if end > len(data):
            return
        payload = data[offset + _FRAME.size : end]
        if zlib.crc32(payload) != checksum:
            if end == len(data):
                return
            raise MessageLogError(
                f"{path}: record at byte {offset} fails its checksum and {len(data) - end} bytes "
                "follow it: the log is damaged, not torn by a crash; refusing to drop them"
            )
        try:
            messages, _ = decode_packet(payload)
        except CodecError as exc:
            raise MessageLogError(f"{path}: record at byte {offset}: {exc}") from None
        if last is not None and messages[0].key <= last:
            raise MessageLogError(
                f"{path}: record at byte {offset} starts at message {messages[0].key}, not after "
                f"{last}: a log holds messages in canonical (step, origin) order"
            )
        last = messages[-1].key
        yield end, messages
        offset = end


def read_messages(path: str | os.PathLike) -> list[Message]:
    """Every whole record's messages, read without touching the file (a torn tail is left out;
    damage raises MessageLogError)."""
    path = Path(path)
    return [m for _, messages in _records(path.read_bytes(), path) for m in messages]


def _frames(messages: Sequence[Message], scalar_format: str) -> bytes:
    """``messages`` as framed records of at most MAX_MESSAGES_PER_PACKET each."""
    out = bytearray()
    for start in range(0, len(messages), MAX_MESSAGES_PER_PACKET):
        payload = encode_packet(messages[start : start + MAX_MESSAGES_PER_PACKET], scalar_format)
        out += _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    return bytes(out)


def write_messages(
    path: str | os.PathLike, messages: Sequence[Message], scalar_format: str = "fp32"
) -> None:
    """Write ``messages`` (in canonical order) as a whole log, atomically."""
    atomic_write_bytes(path, _frames(messages, scalar_format))


def keep_first(path: str | os.PathLike, count: int, scalar_format: str = "fp32") -> None:
    """Cut the log at ``path`` back to its first ``count`` messages, atomically: a run resumed
    from a checkpoint drops what it logged after the checkpoint, since it commits it again."""
    messages = read_messages(path)
    if count > len(messages):
        raise MessageLogError(f"{path} holds {len(messages)} messages, fewer than {count}")
    write_messages(path, messages[:count], scalar_format)


class MessageLog:
    """Committed messages of one peer, in commit order, durable once ``sync`` returns."""

    def __init__(self, path: str | os.PathLike, scalar_format: str = "fp32", sync_every: int = 256):
        if sync_every < 1:
            raise ValueError(f"sync_every must be at least 1; got {sync_every}")
        self.path = Path(path)
        self.scalar_format = scalar_format
        self.sync_every = sync_every
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self._messages: list[Message] = []
        data = self.path.read_bytes()
        valid_end = 0
        for end, messages in _records(data, self.path):
            self._messages += messages
            valid_end = end
        if valid_end < len(data):
            with self.path.open("r+b") as file:
                file.truncate(valid_end)
                os.fsync(file.fileno())
        self._synced = len(self._messages)
        self._file = self.path.open("ab")

    def append(self, messages: Iterable[Message]) -> None:
        """Log messages as they are committed; each must come after the last in (step, origin)
        order, since replay applies them in log order."""
        for message in messages:
            if quantize(message.scalar, self.scalar_format) != message.scalar:
                raise MessageLogError(
                    f"message {message.key} has scalar {message.scalar!r}, which "
                    f"{self.scalar_format} cannot hold exactly: log the value the codec carries"
                )
            if self._messages and message.key <= self._messages[-1].key:
                raise MessageLogError(
                    f"message {message.key} appended after {self._messages[-1].key}: the log "
                    "holds messages in canonical (step, origin) order"
                )
            self._messages.append(message)
        if len(self._messages) - self._synced >= self.sync_every:
            self.sync()

    def sync(self) -> None:
        """Write and fsync everything appended so far (nothing, not even an fsync, if that is
        nothing: peers call it every round)."""
        unsynced = self._messages[self._synced :]
        if not unsynced:
            return
        self._file.write(_frames(unsynced, self.scalar_format))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._synced = len(self._messages)

    def messages(self, start: int = 0) -> list[Message]:
        """The committed messages from index ``start`` on, synced or not."""
        return self._messages[start:]

    @property
    def last(self) -> Message | None:
        """The latest committed message, if any."""
        return self._messages[-1] if self._messages else None

    @property
    def synced(self) -> int:
        """How many messages a crash now would keep."""
        return self._synced

    def __len__(self) -> int:
        return len(self._messages)

    def close(self) -> None:
        self.sync()
        self._file.close()

    def __enter__(self) -> MessageLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def by_step(messages: Sequence[Message]) -> Iterator[tuple[int, list[Message]]]:
    """(position of its first message, its messages) for each step of a canonical log: replay
    that clips needs whole steps."""
    start = 0
    while start < len(messages):
        end = start
        while end < len(messages) and messages[end].step == messages[start].step:
            end += 1
        yield start, list(messages[start:end])
        start = end
