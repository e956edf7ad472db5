"""A simulated SeedFlood run's ledger: the messages it commits, logged round by round in the real
peers' log format, and its manifest, written when the run starts and completed when it ends (see
`seedflood.protocol.ledger`).

The log follows the checkpoint: it is synced before each checkpoint is written, and a resumed run
cuts it back to what its checkpoint had committed, so a killed and resumed run logs what an
uninterrupted one does. Over perfect links every message a run makes is either in the log or, with
delayed flooding (hops below the diameter), still in flight; those are written at each evaluation
beside the log (``in_flight.log``). Both with history.jsonl then resume a run with no checkpoint:
its rounds are replayed without a forward pass, from files of a few kilobytes, so a long run can be
committed evaluation by evaluation and continued on another machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.config import RunConfig
from seedflood.files import read_jsonl
from seedflood.protocol.ledger import LOG, MANIFEST, write_manifest
from seedflood.protocol.message_log import (
    MessageLog,
    by_step,
    keep_first,
    read_messages,
    write_messages,
)
from seedflood.protocol.messages import Message
from seedflood.sim.checkpoint import CheckpointError, config_differences

IN_FLIGHT = "in_flight.log"
"""Messages made but not yet committed at the last evaluation; removed when the run ends."""


class RunLedger:
    """The ledger of ``algorithm``'s run in ``out``, opened afresh, or where the restored
    algorithm's checkpoint left it; ``base_hash`` is the untrained model's state hash."""

    def __init__(self, out: Path, config: RunConfig, algorithm: SeedFlood, base_hash: str) -> None:
        self.path, self.in_flight_path = out / LOG, out / IN_FLIGHT
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
        """Make the log durable, and with it the messages still in flight."""
        self.log.sync()
        in_flight = self.algorithm.in_flight()
        if in_flight:
            write_messages(self.in_flight_path, in_flight, self.config.scalar_format)
        else:
            self.in_flight_path.unlink(missing_ok=True)

    def close(self) -> dict[str, Any]:
        """Close the log, written anew in whole records (its framing then does not depend on
        when a crash made the run resume), and write the manifest; the fields results.json
        takes."""
        self.log.close()
        keep_first(self.path, len(self.log), self.config.scalar_format)
        self.in_flight_path.unlink(missing_ok=True)
        manifest = self._manifest(self.algorithm.state_hash())
        return {"ledger_messages": manifest["messages"], "ledger_bytes": manifest["log_bytes"]}


def resume_from_ledger(out: Path, config: RunConfig, algorithm: SeedFlood) -> list[dict[str, Any]]:
    """Replay the rounds up to the last evaluation in ``out``/history.jsonl whose messages the
    log and the in-flight file hold into the freshly built ``algorithm``; that history (cut
    there), or [] where the run cannot be resumed this way (no history beyond round 0, or links
    that lose messages, whose repair the files do not record)."""
    history_file = out / "history.jsonl"
    if not (history_file.is_file() and (out / LOG).is_file()) or not replayable(algorithm):
        return []
    history = read_jsonl(history_file)
    if not history or history[-1]["round"] == 0:
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
    made = _made(out, config.clients)
    steps = 0  # the steps whose every client's message is held, from the first on
    while len(made.get(steps, ())) == config.clients:
        steps += 1
    covered = [entry for entry in history if entry["round"] * config.steps_per_round <= steps]
    rounds = covered[-1]["round"]
    if rounds == 0:
        raise CheckpointError(
            f"{out / LOG} and {out / IN_FLIGHT} hold the messages of {steps} steps, fewer than "
            f"any evaluation {history_file} records needs: the ledger was cut; run it afresh"
        )
    for round_index in range(rounds):
        first = round_index * config.steps_per_round
        algorithm.replay_round(
            round_index,
            [m for step in range(first, first + config.steps_per_round) for m in made[step]],
        )
    algorithm.take_committed()  # logged already; RunLedger cuts the log back to these rounds
    return covered


def _made(out: Path, clients: int) -> dict[int, list[Message]]:
    """Every message the log and the in-flight file hold, by step, each step's in origin order;
    a message from no client of the run, or one the two files give different scalars, is refused
    (the files are damaged or from different runs)."""
    made: dict[tuple[int, int], Message] = {}
    in_flight = out / IN_FLIGHT
    for message in [
        *read_messages(out / LOG),
        *(read_messages(in_flight) if in_flight.is_file() else []),
    ]:
        if message.origin >= clients:
            raise CheckpointError(
                f"{out} holds a message from client {message.origin}, but the run has {clients} "
                f"clients (0 to {clients - 1}): its ledger is from another run; run it afresh"
            )
        if made.setdefault(message.key, message) != message:
            raise CheckpointError(
                f"{out / LOG} and {in_flight} disagree on message {message.key}: they were "
                "written by different runs; run it afresh"
            )
    canonical = [made[key] for key in sorted(made)]
    return {messages[0].step: messages for _, messages in by_step(canonical)}


def replayable(algorithm: SeedFlood) -> bool:
    """Whether the log and the in-flight file hold all of a run's state: over perfect links,
    flooding is a function of the messages alone."""
    return algorithm.repair is None
