"""A simulated SeedFlood run's ledger: the messages it commits, logged round by round in the real
peers' log format, and its manifest, written when the run starts and completed when it ends (see
`seedflood.protocol.ledger`).

Every round the log is synced, the messages still in flight (with delayed flooding, hops below the
diameter) are written beside it (``in_flight.log``), and then, once its evaluation (if any) is in
history.jsonl, the round and the run's time so far (``ledger_round.json``). Those files with
history.jsonl resume a run with or without a checkpoint, at the last round they hold, not the last
evaluation: its rounds are replayed without a forward pass from files of a few kilobytes, so a
long run stopped at any point loses at most the round it was in, and can be committed and
continued on another machine. A resumed run first cuts the log back to what it resumed from, so a
killed and resumed run logs what an uninterrupted one does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.config import RunConfig
from seedflood.files import atomic_write_json, read_jsonl
from seedflood.protocol.ledger import LOG, MANIFEST, write_manifest
from seedflood.protocol.message_log import (
    MessageLog,
    by_step,
    keep_first,
    read_messages,
    write_messages,
)
from seedflood.protocol.messages import Message
from seedflood.sim.checkpoint import CheckpointError, config_differences, data_difference

IN_FLIGHT = "in_flight.log"
"""Messages made but not yet committed at the last round logged; removed when the run ends."""

LAST_ROUND = "ledger_round.json"
"""The last round logged, with the run's training and wall seconds then; removed when the run
ends."""


TIMES = ("train_seconds", "wall_seconds")


Replayed = Callable[[int, int], None]
"""Told the rounds replayed so far and how many a resume replays: a long run's replay takes
minutes, and whoever waits should see it move."""


def no_replay_report(_done: int, _total: int) -> None:
    """Where nobody watches the replay."""


class LedgerPoint(NamedTuple):
    """Where a run resumed from its ledger stands: its rounds done, its history (the evaluations
    up to them) and its time so far."""

    round: int
    history: list[dict[str, Any]]
    train_seconds: float
    wall_seconds: float


class RunLedger:
    """The ledger of ``algorithm``'s run in ``out``, opened afresh, or where the restored
    algorithm's checkpoint left it; ``base_hash`` is the untrained model's state hash and
    ``data`` the identity of the examples the run trains on (`TaskData.identity`)."""

    def __init__(
        self,
        out: Path,
        config: RunConfig,
        algorithm: SeedFlood,
        base_hash: str,
        data: dict[str, int | str],
    ) -> None:
        self.path, self.in_flight_path = out / LOG, out / IN_FLIGHT
        self.config, self.algorithm, self.base_hash = config, algorithm, base_hash
        self.data = data
        committed = algorithm.committed_count
        if committed == 0:
            for stale in (self.path, self.in_flight_path, out / LAST_ROUND):
                stale.unlink(missing_ok=True)
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
            data=self.data,
        )

    def commit_round(self) -> None:
        """Log what the last round committed and make it durable, and with it the messages
        still in flight (two fsyncs of a few bytes, nothing beside a round's forward passes)."""
        self.log.append(self.algorithm.take_committed())
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
        (self.path.parent / LAST_ROUND).unlink(missing_ok=True)
        manifest = self._manifest(self.algorithm.state_hash())
        return {"ledger_messages": manifest["messages"], "ledger_bytes": manifest["log_bytes"]}


def mark_round(out: Path, done: int, train_seconds: float, wall_seconds: float) -> None:
    """Round ``done`` of the run in ``out`` is whole: its messages (or scalars) logged and, at an
    evaluation, its history written. A resume starts from the last round marked, never one
    whose evaluation is lost."""
    point = {"round": done, "train_seconds": train_seconds, "wall_seconds": wall_seconds}
    atomic_write_json(out / LAST_ROUND, point)


def resume_from_ledger(
    out: Path,
    config: RunConfig,
    algorithm: SeedFlood,
    data: dict[str, int | str],
    replayed: Replayed = no_replay_report,
) -> LedgerPoint | None:
    """Replay into the freshly built ``algorithm`` the rounds up to the last one the log and the
    in-flight file in ``out`` hold whole and ledger_round.json or history.jsonl timed (the later
    of the two); where it stands then, or None where the run cannot be resumed this way (no
    round beyond 0, or links that lose messages, whose repair the files do not record). A
    ledger made under another config, or on other examples than ``data`` identifies, is
    refused: replayed, it would pass a model trained on them off as this run's. ``replayed`` is
    told each round replayed, and how many there are."""
    history_file = out / "history.jsonl"
    if not (history_file.is_file() and (out / LOG).is_file()) or not replayable(algorithm):
        return None
    history = read_jsonl(history_file)
    if not history:
        return None
    try:
        manifest = json.loads((out / MANIFEST).read_text())
        written, recorded = manifest["config"], manifest.get("data")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(
            f"{out / MANIFEST} is missing or unreadable: without it the log cannot be checked "
            "against this run's config; run it again without --resume"
        ) from None
    check_origin(f"the ledger in {out}", written, recorded, config, data)
    made = _made(out, config.clients)
    steps = 0  # the steps whose every client's message is held, from the first on
    while len(made.get(steps, ())) == config.clients:
        steps += 1
    point = resume_point(out, history, steps // config.steps_per_round)
    if point.round == 0:
        if history[-1]["round"] == 0:
            return None
        raise CheckpointError(
            f"{out / LOG} and {out / IN_FLIGHT} hold the messages of {steps} steps, fewer than "
            f"any evaluation {history_file} records needs: the ledger was cut; run it afresh"
        )
    for round_index in range(point.round):
        first = round_index * config.steps_per_round
        algorithm.replay_round(
            round_index,
            [m for step in range(first, first + config.steps_per_round) for m in made[step]],
        )
        replayed(round_index + 1, point.round)
    algorithm.take_committed()  # logged already; RunLedger cuts the log back to these rounds
    return point


def check_origin(
    ledger: str, written: Any, recorded: Any, config: RunConfig, data: dict[str, int | str]
) -> None:
    """Refuse the ``ledger`` (named so) whose ``written`` config or ``recorded`` data identity is
    not this run's: replayed, it would pass a model trained on them off as this run's."""
    differences = config_differences(written, config)
    if differences:
        raise CheckpointError(
            f"{ledger} was written by a run with another config: "
            f"{'; '.join(differences)}. Resume with that config, or run without --resume"
        )
    changed = data_difference(recorded, data)
    if changed:
        raise CheckpointError(
            f"{ledger} was written by a run on other data ({changed}): the data files changed "
            "since; run it again without --resume"
        )


def resume_point(out: Path, history: list[dict[str, Any]], held: int) -> LedgerPoint:
    """The later of the last evaluation and the last round logged that the ``held`` rounds
    reach (a round logged beyond them is from before a resume that cut the log back)."""
    covered = [entry for entry in history if entry["round"] <= held]
    last = covered[-1] if covered else {"round": 0, "train_seconds": 0.0, "wall_seconds": 0.0}
    logged = last_round(out)
    if logged is not None and last["round"] < logged["round"] <= held:
        last = logged
    return LedgerPoint(
        last["round"],
        [entry for entry in covered if entry["round"] <= last["round"]],
        last["train_seconds"],
        last["wall_seconds"],
    )


def last_round(out: Path) -> dict[str, Any] | None:
    """ledger_round.json in ``out``, checked, or None where there is none."""
    path = out / LAST_ROUND
    if not path.is_file():
        return None
    try:
        point = json.loads(path.read_text())
        valid = (
            isinstance(point, dict)
            and type(point.get("round")) is int
            and point["round"] >= 0
            and all(isinstance(point.get(k), int | float) for k in TIMES)
        )
    except (OSError, ValueError):
        valid = False
    if not valid:
        raise CheckpointError(
            f"{path} is damaged: it must hold a round (a whole number) with its train_seconds "
            "and wall_seconds; delete it to resume from the last evaluation instead"
        )
    return point


def ledger_ahead(out: Path, checkpoint: int | None) -> bool:
    """Whether the ledger in ``out`` (SeedFlood's or a zeroth-order gossip run's, where it can
    be replayed) reaches a round beyond ``checkpoint``, the checkpoint's (None, unreadable, is
    left for loading it to refuse): resuming from the ledger then loses less. It reaches the
    later of the last round it logged whole and history.jsonl's last evaluation, written after
    its round is logged and before the checkpoint: a run killed between the two keeps an older
    checkpoint."""
    logged = last_round(out)
    history_file = out / "history.jsonl"
    if logged is None or not history_file.is_file():
        return False
    history = read_jsonl(history_file)
    reach = max(logged["round"], history[-1]["round"]) if history else logged["round"]
    return checkpoint is not None and reach > checkpoint


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
