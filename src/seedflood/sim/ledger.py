"""A simulated SeedFlood run's ledger: the messages it commits, logged round by round in the real
peers' log format, and its manifest, written when the run starts and completed when it ends (see
`seedflood.protocol.ledger`).

The log follows the checkpoint: it is synced before each checkpoint is written, and a resumed run
cuts it back to what its checkpoint had committed, so a killed and resumed run logs what an
uninterrupted one does. Where every message is committed in the round it is made (flooding with
hops ≥ diameter over perfect links), the log and history.jsonl alone also resume a run, with no
checkpoint: its rounds are replayed without a forward pass. Both files are a few kilobytes, so a
long run can be committed evaluation by evaluation and continued on another machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.config import RunConfig
from seedflood.files import read_jsonl
from seedflood.protocol.ledger import LOG, MANIFEST, write_manifest
from seedflood.protocol.message_log import MessageLog, keep_first, read_messages
from seedflood.sim.checkpoint import CheckpointError, config_differences


class RunLedger:
    """The ledger of ``algorithm``'s run in ``out``, opened afresh, or where the restored
    algorithm's checkpoint left it; ``base_hash`` is the untrained model's state hash."""

    def __init__(self, out: Path, config: RunConfig, algorithm: SeedFlood, base_hash: str) -> None:
        self.path = out / LOG
        self.config, self.algorithm, self.base_hash = config, algorithm, base_hash
        committed = algorithm.committed_count
        if committed == 0:
            self.path.unlink(missing_ok=True)
        elif self.path.is_file():
            keep_first(self.path, committed, config.scalar_format)
        self.log = MessageLog(self.path, config.scalar_format)
        if len(self.log) != committed:
            raise CheckpointError(
                f"{self.path} holds {len(self.log)} messages but the checkpoint committed "
                f"{committed}: the run's ledger was lost; run it again without --resume"
            )
        self._manifest(state_hash="")

    def _manifest(self, state_hash: str) -> dict[str, Any]:
        return write_manifest(
            self.path.parent,
            self.config.model_dump(mode="json"),
            local_steps=self.config.steps_per_round,
            warmup_steps=self.config.warmup,
            base_hash=self.base_hash,
            state_hash=state_hash,
            messages=len(self.log),
        )

    def record(self) -> None:
        """Log what the last round committed."""
        self.log.append(self.algorithm.take_committed())

    def sync(self) -> None:
        self.log.sync()

    def close(self) -> dict[str, Any]:
        """Close the log, written anew in whole records (its framing then does not depend on
        when a crash made the run resume), and write the manifest; the fields results.json
        takes."""
        self.log.close()
        keep_first(self.path, len(self.log), self.config.scalar_format)
        manifest = self._manifest(self.algorithm.state_hash())
        return {"ledger_messages": manifest["messages"], "ledger_bytes": manifest["log_bytes"]}


def resume_from_ledger(out: Path, config: RunConfig, algorithm: SeedFlood) -> list[dict[str, Any]]:
    """Replay the rounds up to the last evaluation in ``out``/history.jsonl from ``out``'s log
    into the freshly built ``algorithm``; that history, or [] where the run cannot be resumed
    this way (no history beyond round 0, or messages that outlive their round)."""
    history_file = out / "history.jsonl"
    if not (history_file.is_file() and (out / LOG).is_file()) or not replayable(algorithm):
        return []
    history = read_jsonl(history_file)
    rounds = history[-1]["round"] if history else 0
    if rounds == 0:
        return []
    try:
        written = json.loads((out / MANIFEST).read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(
            f"{out / MANIFEST} is missing or unreadable: without it the log cannot be checked "
            "against this run's config; run it again without --resume"
        ) from None
    differences = config_differences(written, config)
    if differences:
        raise CheckpointError(
            f"the ledger in {out} was written by a run with another config: "
            f"{'; '.join(differences)}. Resume with that config, or run without --resume"
        )
    per_round = config.steps_per_round * config.clients
    messages = read_messages(out / LOG)
    if len(messages) < rounds * per_round:
        raise CheckpointError(
            f"{out / LOG} holds {len(messages)} messages, fewer than the {rounds * per_round} of "
            f"the {rounds} rounds {history_file} records: the ledger was cut; run it afresh"
        )
    for round_index in range(rounds):
        algorithm.replay_round(
            round_index, messages[round_index * per_round : (round_index + 1) * per_round]
        )
    algorithm.take_committed()  # logged already; RunLedger cuts the log back to these rounds
    return history


def replayable(algorithm: SeedFlood) -> bool:
    """Whether every message a round makes is committed within it, so the log holds all state."""
    return algorithm.repair is None and algorithm.hops >= algorithm.topology.diameter
