"""Where a simulation computes, and the memory it takes there.

The device is an execution setting, like the data directory, not part of a run.

A GPU changes the last bits of sums (its kernels reduce in other orders), not what is trained, so
a run on a GPU is the same experiment as on the CPU: the device comes from $SEEDFLOOD_DEVICE, not
from the config, ``compare`` counts a run finished on either, and results.json records where it
ran. Random draws stay on the CPU on every device (seedflood.zo, sample_batch, add_lora), so a
seed means the same directions, batches and adapters everywhere.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import psutil
import torch

from seedflood.build import compute_device
from seedflood.config import ConfigError

DEVICE_VARIABLE = "SEEDFLOOD_DEVICE"
DRAW_THREADS_VARIABLE = "SEEDFLOOD_DRAW_THREADS"
MOST_DRAW_THREADS = 64


def run_device() -> torch.device:
    """The device $SEEDFLOOD_DEVICE names (the CPU when unset), checked before any work."""
    return compute_device(
        os.environ.get(DEVICE_VARIABLE, "").strip() or "cpu",
        setting=f"${DEVICE_VARIABLE}",
        on_cpu=f"unset {DEVICE_VARIABLE} to run on the CPU",
    )


def draw_threads() -> int:
    """How many threads draw full-parameter DZSGD's directions ahead of their use
    ($SEEDFLOOD_DRAW_THREADS; seedflood.zo.ahead). An execution setting like the device: the draws
    are the same values whatever the number, which sets only speed and memory (one model-sized
    CPU buffer a thread, and one more). Unset, one a core, at most 8: on a GPU's host the draws
    are most of a round, and on this 2-core CPU two threads made full DZSGD's replays 22-28%
    faster, its trained rounds no faster than the machine's noise, and one thread did not help
    (docs/performance.md). 0 draws each direction when it is needed, as before."""
    text = os.environ.get(DRAW_THREADS_VARIABLE, "").strip()
    if not text:
        return min(8, os.cpu_count() or 1)
    if not text.isdigit() or int(text) > MOST_DRAW_THREADS:
        raise ConfigError(
            f"{DRAW_THREADS_VARIABLE}={text!r}: give a whole number from 0 (draw each direction "
            f"when it is needed) to {MOST_DRAW_THREADS}, or unset it for one a core, at most 8"
        )
    return int(text)


def available_bytes(device: torch.device) -> int:
    """Memory free for new tensors on ``device``: the GPU's own, or the machine's."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def peak_device_mb(device: torch.device) -> float | None:
    """Peak GPU memory the run's tensors took, or None on the CPU (peak RSS says it there)."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


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
