"""Which ledger a run keeps: SeedFlood's message log (`seedflood.sim.ledger`), a zeroth-order
gossip run's scalars (`seedflood.sim.scalar_ledger`), or none (first-order gossip, whose state
is its checkpoint alone). The run loop asks here and never names a method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seedflood.algorithms.common import Algorithm
from seedflood.algorithms.seedflood import SeedFlood
from seedflood.config import RunConfig
from seedflood.protocol.ledger import MANIFEST
from seedflood.sim import ledger, scalar_ledger
from seedflood.sim.ledger import LedgerPoint, Replayed, RunLedger, no_replay_report
from seedflood.sim.scalar_ledger import ScalarLedger, logs_scalars

Data = dict[str, int | str]


def replayable(algorithm: Algorithm) -> bool:
    """Whether the run's ledger holds all its state, so that it can resume the run alone."""
    if isinstance(algorithm, SeedFlood):
        return ledger.replayable(algorithm)
    return logs_scalars(algorithm)


def untrained_hash(algorithm: Algorithm) -> str:
    """The untrained state's hash, which a ledger records and a resume checks; empty for a run
    that keeps no ledger."""
    if isinstance(algorithm, SeedFlood):
        return algorithm.state_hash()
    return scalar_ledger.base_hash(algorithm) if logs_scalars(algorithm) else ""


def resume_from_ledgers(
    algorithm: Algorithm,
    out: Path,
    config: RunConfig,
    base: str,
    data: Data,
    replayed: Replayed = no_replay_report,
    start: int = 0,
) -> LedgerPoint | None:
    """Where the run's ledger in ``out`` resumes it, its rounds replayed into ``algorithm``
    (``replayed`` told of each) from round ``start``, where a checkpoint left it (a scalar
    ledger's rounds replay from any round; SeedFlood's from 0); None where it keeps none or there
    is nothing to resume."""
    if isinstance(algorithm, SeedFlood) and not start:
        return ledger.resume_from_ledger(out, config, algorithm, data, replayed)
    if logs_scalars(algorithm):
        return scalar_ledger.resume_from_scalars(
            out, config, algorithm, base, data, replayed, start
        )
    return None


def continues_a_checkpoint(algorithm: Algorithm) -> bool:
    """Whether the ledger can take ``algorithm`` on from a checkpoint's round: a scalar ledger
    replays any round from the state before it, so a checkpoint behind it spares the replay of
    every round up to it (full DZSGD's replay costs three quarters of training)."""
    return logs_scalars(algorithm)


def open_ledger(
    algorithm: Algorithm, out: Path, config: RunConfig, base: str, data: Data, done: int
) -> RunLedger | ScalarLedger | None:
    """The ledger the run logs its rounds to from round ``done`` on, or None where it keeps none."""
    if isinstance(algorithm, SeedFlood):
        return RunLedger(out, config, algorithm, base, data)
    if logs_scalars(algorithm):
        return ScalarLedger(out, config, algorithm, base, data, done)
    return None


def ledger_origin(out: Path) -> dict[str, Any] | None:
    """What the ledger of a part-way run in ``out`` was made under (its ``config`` and ``data``):
    SeedFlood's manifest or a scalar ledger's first line; None where neither can be read."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return scalar_ledger.header(out)
    return manifest if isinstance(manifest, dict) else None
