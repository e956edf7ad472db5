"""Seeds: every direction is regenerated from a seed derived from public facts (the run's seed,
a message's origin and step), so no seed ever travels and every client rebuilds any update."""

from __future__ import annotations

import hashlib
import struct

import numpy as np

Update = tuple[int, int, float]
"""(seed, step, coefficient): add coefficient × the direction that seed draws at that step."""


def derive_seed(run_seed: int, *parts: int | str) -> int:
    """A 63-bit seed that depends on every part, so no seed ever needs to travel."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (run_seed, *parts):
        data = part.encode() if isinstance(part, str) else struct.pack("<q", part)
        digest.update(struct.pack("<B", len(data)) + data)
    return int.from_bytes(digest.digest(), "little") >> 1


def message_generator(seed: int) -> np.random.Generator:
    """The generator a message's direction is drawn from. ``torch.Generator`` keeps only the low
    32 bits of a seed, so with 128 clients × 5,000 steps some 47 pairs of messages would share a
    direction; PCG64 takes all 64 bits (through numpy's SeedSequence) and draws on the CPU, the
    same on every device."""
    return np.random.Generator(np.random.PCG64(seed))


def message_seed(run_seed: int, origin: int, step: int) -> int:
    """The seed of client ``origin``'s update at ``step``; every client computes the same one."""
    return derive_seed(run_seed, "message", origin, step)
