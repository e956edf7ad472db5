"""Results files: written whole or not at all.

A run killed mid-write must never leave a truncated ``results.json`` that a report would read as
real, so every file is written to a temporary sibling, fsync'd, and renamed over the target; the
directory is fsync'd too, since a rename is only durable once its directory entry is.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), durable)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    atomic_write(path, lambda file: file.write(data), durable)


def atomic_write(
    path: str | os.PathLike, write: Callable[[BinaryIO], object], durable: bool = True
) -> None:
    """Stream ``write``'s output into ``path``: a checkpoint of a large model never needs a second
    in-memory copy as bytes. A reader sees the old file or the new one, never part of one; not
    ``durable``, a crash may bring back the old one (two fsyncs saved: what a status file that
    is rewritten every round, read only while its writer runs, is worth)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o644)  # mkstemp makes 0600: results are for everyone to read
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            if durable:
                os.fsync(file.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Delete what a process killed inside ``atomic_write`` left beside ``path``: never read, but
    a run resumed many times would otherwise pile up partial checkpoints."""
    target = Path(path)
    for temp in target.parent.glob(f".{target.name}.*.tmp"):
        temp.unlink(missing_ok=True)


def atomic_write_json(path: str | os.PathLike, data: Any, durable: bool = True) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", durable)


def atomic_write_json_gz(path: str | os.PathLike, data: Any) -> None:
    """Compact JSON, gzip-compressed: a pipeline run's per-iteration record is half a megabyte as
    indented text and a tenth of that compressed, and the repository travels whole to a lent GPU
    under a size limit. The gzip header's time is zero, so one record always gives one file."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
    atomic_write_bytes(path, gzip.compress(text.encode(), mtime=0))


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file, gzip-compressed when its name ends in .gz."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def atomic_write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
