"""Where a simulation computes: an execution setting, like the data directory, not part of a run.

A GPU changes the last bits of sums (its kernels reduce in other orders), not what is trained, so
a run on a GPU is the same experiment as on the CPU: the device comes from $SEEDFLOOD_DEVICE, not
from the config, ``compare`` counts a run finished on either, and results.json records where it
ran. Random draws stay on the CPU on every device (seedflood.zo, sample_batch, add_lora), so a
seed means the same directions, batches and adapters everywhere.
"""

from __future__ import annotations

import os

import psutil
import torch

from seedflood.config import ConfigError

DEVICE_VARIABLE = "SEEDFLOOD_DEVICE"
_ALLOWED = "'cpu', 'cuda' or 'cuda:N'"


def run_device() -> torch.device:
    """The device $SEEDFLOOD_DEVICE names (the CPU when unset), checked before any work."""
    name = os.environ.get(DEVICE_VARIABLE, "").strip() or "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"${DEVICE_VARIABLE}={name!r} is not a device; use {_ALLOWED}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"${DEVICE_VARIABLE}={name!r}: simulations run on {_ALLOWED}")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"${DEVICE_VARIABLE}={name!r}, but this torch ({torch.__version__}) sees no CUDA GPU; "
            f"unset {DEVICE_VARIABLE} to run on the CPU"
        )
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        raise ConfigError(f"${DEVICE_VARIABLE}={name!r}, but only cuda:0 to cuda:{count - 1} exist")
    return device


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
