"""Timing shared by the benchmark scripts: medians, since this 2-core machine is noisy, and the
machine that measured them, since a figure means little without it."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def machine() -> dict[str, object]:
    """The CPU (model name from /proc/cpuinfo where there is one), its cores, the threads torch
    computes with, and torch's version."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
        if line.startswith("model name")
    ]
    return {
        "cpu": names[0] if names else platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
