"""What a peer process is told and how it reports trouble.

Kept apart so that the node, its seating and its exchange can all use them without importing one
another.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "EQUIVOCATE_VARIABLE",
    "HOSTILE_VARIABLE",
    "SILENT_VARIABLE",
    "PeerError",
    "PeerOptions",
    "Say",
    "fault_round",
]

SILENT_VARIABLE = "SEEDFLOOD_SILENT_FROM_ROUND"
EQUIVOCATE_VARIABLE = "SEEDFLOOD_EQUIVOCATE_AT_ROUND"
HOSTILE_VARIABLE = "SEEDFLOOD_HOSTILE_AT_ROUND"

Say = Callable[[str], None]


class PeerError(RuntimeError):
    """What stops a peer, phrased for its operator."""


@dataclass
class PeerOptions:
    """How one peer process runs; the training itself is the run's config."""

    run_id: str
    state_dir: Path
    out_dir: Path
    initial_peers: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    ttl: float = 6.0
    pace: float = 0.0
    evaluate: bool = True
    start_timeout: float = 120.0
    linger: float = 60.0
    # Where the model lives and the forwards run, like the simulator's $SEEDFLOOD_DEVICE: an
    # execution setting, not the run's ('auto': a GPU where torch sees one, else the CPU).
    device: str = "auto"
    # The public keys (hex) that may hold a seat in the run; None: any key (an open run, for a
    # network whose members trust each other; docs/peers.md, "Trust model").
    allowed: frozenset[str] | None = None
    # Typical round times to wait for a member that sends nothing before proposing its removal.
    silent_rounds: float = 10.0
    # The least that wait may be, in seconds: a run whose crashed peers restart slowly (a large
    # model to load) raises it, so the others do not remove a peer that is on its way back.
    patience: float = 0.0


def fault_round(variable: str, doing: str, say: Say) -> int | None:
    """The round at which this peer misbehaves on purpose, for tests of removal by quorum:
    ``$SEEDFLOOD_SILENT_FROM_ROUND`` (it stays alive and keeps its DHT record, and sends nothing
    more), ``$SEEDFLOOD_EQUIVOCATE_AT_ROUND`` (it signs two versions of that round and sends
    each to half of its neighbours) or ``$SEEDFLOOD_HOSTILE_AT_ROUND`` (beside its honest batch
    it pushes signed batches far in the future, a members table with a phantom seat, an
    unsigned eviction, and a forged batch that gets it banned)."""
    text = os.environ.get(variable, "")
    if not text:
        return None
    if not text.isdigit():
        raise PeerError(f"${variable} must be a round number; got {text!r}")
    say(f"{doing} round {text} on purpose (${variable})")
    return int(text)
