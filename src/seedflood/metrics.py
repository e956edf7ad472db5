"""Results files: written whole or not at all.

A run killed mid-write must never leave a truncated ``results.json`` that a report would read as
real, so every file is written to a temporary sibling, fsync'd, and renamed over the target; the
directory is fsync'd too, since a rename is only durable once its directory entry is.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write(path, lambda file: file.write(data))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Stream ``write``'s output into ``path``: a checkpoint of a large model never needs a second
    in-memory copy as bytes."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o644)  # mkstemp makes 0600: results are for everyone to read
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
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


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def atomic_write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_rss() -> bool:
    """Start the peak that ``peak_rss_mb`` reports afresh, from what the process holds now.

    A comparison runs its grid in one process, and the process's lifetime peak would credit
    every run with the largest of those before it (a resume's, say). Linux resets the peak when
    "5" is written to /proc/self/clear_refs; elsewhere this returns False and the peak stays the
    process's."""
    try:
        PROC_CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def proc_status_kb(field: str, pid: int | str = "self") -> int | None:
    """A memory field of /proc/<pid>/status in kilobytes; None where the process has exited,
    the field is absent (a zombie has no RssAnon) or the system has no /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = [line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:")]
    return int(values[0]) if values else None


def peak_rss_mb() -> float:
    """Peak resident memory of this process since ``reset_peak_rss`` (VmHWM), or since it
    started where /proc has no VmHWM (ru_maxrss; Linux reports both in kilobytes)."""
    peak_kb = proc_status_kb("VmHWM")
    if peak_kb is None:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak_kb / 1024.0


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: benchmarks print the rows the docs quote, so the two cannot drift."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
