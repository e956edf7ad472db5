"""A SeedFlood run as a ledger: its committed messages and a manifest of what they mean.

The trained model is the base model plus every committed message applied in canonical order, so
the message log (`seedflood.protocol.message_log`, a few bytes per message) and a manifest of the
base model, its hash and the config keys that shape an update are the whole run: `seedflood
replay` rebuilds the model from them alone, with no data and no forward pass, and checks it ends
on the run's state hash. Simulated runs and real peers write the same two files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedflood.files import atomic_write_json
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.guard import DivergenceGuard
from seedflood.protocol.message_log import by_step, read_messages
from seedflood.protocol.messages import Message
from seedflood.protocol.updates import message_updates
from seedflood.zo import DenseDirection, SubCGEDirection

MANIFEST = "manifest.json"
LOG = "messages.log"
LEDGER_VERSION = 1
UPDATE_KEYS: tuple[str, ...] = (
    "model",
    "seed",
    "clients",
    "lr",
    "lr_schedule",
    "warmup_steps",
    "rounds",
    "local_steps",
    "direction",
    "rank",
    "refresh",
    "scalar_format",
    "clip_multiple",
    "clip_window",
)
"""The run config's keys that decide what a message does to the model: with the base model and
the log they fix the trained model, so a replay reads nothing else. Not among them: what only
shapes the scalar a client computes (eps, batch_size, the forwards' precision ``dtype``), since a
replay applies the logged scalars in fp32 and makes no forward pass."""


def apply_log(
    direction: DenseDirection | SubCGEDirection,
    messages: Sequence[Message],
    *,
    run_seed: int,
    lr: Callable[[int], float],
    clients: int,
    clip: ScalarClip | None = None,
    guard: DivergenceGuard | None = None,
    start: int = 0,
) -> None:
    """Apply a canonical log's messages from index ``start`` on to ``direction``'s parameters,
    as commits applied them: clipped step by step where the run clipped (the clip window needs
    every step again, applied or not), and shown to ``guard`` so that its window is where the
    run's was (a log never holds a step the guard refused)."""

    def apply(part: Sequence[Message]) -> None:
        direction.apply(message_updates(part, run_seed=run_seed, lr=lr, clients=clients))

    if clip is None and guard is None:
        apply(messages[start:])
        return
    for index, step_messages in by_step(messages):
        committed = step_messages if clip is None else clip.commit(step_messages)
        if guard is not None and guard.check(step_messages[0].step, committed):
            raise LedgerError(
                f"the divergence guard refuses step {step_messages[0].step} of the log"
            )
        if index >= start:
            apply(committed)


class LedgerError(ValueError):
    """A run directory whose ledger is missing, damaged or does not end where the run ended."""


def update_record(config: dict[str, Any], *, local_steps: int, warmup_steps: int) -> dict[str, Any]:
    """``config``'s (a JSON config dump) values of UPDATE_KEYS with ``local_steps`` and
    ``warmup_steps`` resolved: a manifest records it for replays, and the peers of one run must
    agree on it, so both compare what a rule resolved rather than what a config left unsaid."""
    return {
        **{key: config[key] for key in UPDATE_KEYS},
        "local_steps": local_steps,
        "warmup_steps": warmup_steps,
    }


def write_manifest(
    directory: Path,
    config: dict[str, Any],
    *,
    local_steps: int,
    warmup_steps: int,
    base_hash: str,
    state_hash: str,
    messages: int,
    data: dict[str, int | str] | None = None,
) -> dict[str, Any]:
    """Write ``directory``/manifest.json for a run of ``config`` (a JSON config dump) whose log
    holds ``messages`` committed messages; returns what it wrote. ``local_steps`` and
    ``warmup_steps`` are the run's resolved values (the config may leave them to defaults or give
    the warm-up as a ratio), so a replay needs no rule to resolve them. A run writes it when it
    starts, with no ``state_hash`` yet, so that resuming from the log can check the config (and
    ``data``, the identity of the examples it trains on, where the writer knows it), and again
    when it ends."""
    manifest = {
        "ledger_version": LEDGER_VERSION,
        "update": update_record(config, local_steps=local_steps, warmup_steps=warmup_steps),
        "base_hash": base_hash,
        "state_hash": state_hash,
        "messages": messages,
        "log_bytes": (directory / LOG).stat().st_size,
        "config": config,
        **({"data": data} if data is not None else {}),
    }
    atomic_write_json(directory / MANIFEST, manifest)
    return manifest


def read_ledger(directory: Path) -> tuple[dict[str, Any], list[Message]]:
    """The manifest and the committed messages of the run in ``directory``, checked against each
    other; every problem is a LedgerError naming the file."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise LedgerError(
            f"{path} not found: a SeedFlood run directory (or a peer's state dir) holds "
            f"{MANIFEST} and {LOG} once the run has finished"
        ) from None
    except (OSError, ValueError) as error:
        raise LedgerError(f"{path} is not a readable JSON manifest: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("ledger_version") != LEDGER_VERSION:
        raise LedgerError(f"{path} is not a ledger manifest of version {LEDGER_VERSION}")
    missing = [k for k in ("update", "base_hash", "state_hash", "messages") if k not in manifest]
    if missing or set(manifest["update"]) != set(UPDATE_KEYS):
        raise LedgerError(f"{path} lacks {missing or 'update keys'}: it was not written whole")
    try:
        messages = read_messages(directory / LOG)
    except (OSError, ValueError) as error:
        raise LedgerError(f"{directory / LOG}: {error}") from None
    if not manifest["state_hash"]:
        raise LedgerError(
            f"{path}: the run has not finished, so there is no final state to replay to yet"
        )
    if len(messages) != manifest["messages"]:
        raise LedgerError(
            f"{directory / LOG} holds {len(messages)} messages, but the manifest counts "
            f"{manifest['messages']}: the log does not belong to this manifest"
        )
    return manifest, messages
