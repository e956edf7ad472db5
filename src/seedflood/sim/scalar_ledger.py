"""A zeroth-order gossip run's ledger (DZSGD, full or LoRA): every client's two-point scalar,
round by round, so a run of many hours resumes on another machine from a file of kilobytes.

A gossip run's checkpoint holds the model and every client's parameters (0.6 GB for DZSGD-LoRA at 32
clients, 8.6 GB for full DZSGD at 16), too large to commit between sessions, so such runs were lost
at each session's end. But DZSGD's state after a round is a function of its start and the scalars
alone (directions come from seeds and mixing is fixed: `seedflood.algorithms.gossip`), so
``scalars.jsonl`` holds a header (the config, the data's identity and the untrained state's hash)
and then one line per round of ``steps × clients`` scalars, exact as JSON floats. Beside it
``ledger_round.json`` marks the last round whose evaluation (if any) is in history.jsonl, as for
SeedFlood's ledger (`seedflood.sim.ledger`, whose resume point this shares). Resuming replays the
rounds with no forward pass and ends on the state an uninterrupted run has, bit for bit. The file is
a resume aid only and is removed when the run ends."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from seedflood.algorithms.gossip import Gossip
from seedflood.config import RunConfig
from seedflood.files import atomic_write_text, read_jsonl
from seedflood.learning.models import state_hash
from seedflood.sim.checkpoint import CheckpointError
from seedflood.sim.ledger import (
    LAST_ROUND,
    LedgerPoint,
    Replayed,
    check_origin,
    no_replay_report,
    resume_point,
)

SCALARS = "scalars.jsonl"
FORMAT = 1
LINE_LIMIT = 64 * 1024 * 1024
"""The longest line read: a round's line is one scalar of at most 25 characters per client and
local step, 64 KB at 128 clients and 20 local steps; a line far longer is not this file's."""


def logs_scalars(algorithm: object) -> bool:
    """Whether ``algorithm`` keeps a scalar ledger: gossip with the zeroth-order estimator."""
    return isinstance(algorithm, Gossip) and algorithm.estimator == "zo"


def base_hash(algorithm: Gossip) -> str:
    """The untrained state's hash, taken before anything is resumed (every row is equal then)."""
    return state_hash([algorithm.x[0]])


def _header(config: RunConfig, base: str, data: dict[str, int | str]) -> str:
    record = {"format": FORMAT, "config": config.model_dump(mode="json"), "data": data}
    return json.dumps({**record, "base_hash": base}, sort_keys=True) + "\n"


class ScalarLedger:
    """The scalar ledger of ``algorithm``'s run in ``out``, opened with ``done`` rounds behind it
    (0 for a fresh run, else where the checkpoint or the ledger resumed it): the file is cut back
    to those rounds, so a killed and resumed run logs what an uninterrupted one does."""

    def __init__(
        self,
        out: Path,
        config: RunConfig,
        algorithm: Gossip,
        base: str,
        data: dict[str, int | str],
        done: int,
    ) -> None:
        self.path, self.algorithm = out / SCALARS, algorithm
        kept = _rounds(self.path, config.clients * config.steps_per_round) if done else []
        if len(kept) < done:
            raise CheckpointError(
                f"{self.path} holds {len(kept)} rounds but the run resumed at round {done}: its "
                "ledger was lost; run it again without --resume"
            )
        if not done:
            (out / LAST_ROUND).unlink(missing_ok=True)
        lines = [json.dumps(scalars) + "\n" for scalars in kept[:done]]
        atomic_write_text(self.path, _header(config, base, data) + "".join(lines))
        algorithm.take_scalars()  # replayed or restored: logged already
        self.file = self.path.open("a")

    def commit_round(self) -> None:
        """Log the last round's scalars and make them durable (one fsync of a few kilobytes)."""
        self.file.write(json.dumps(self.algorithm.take_scalars()) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> dict[str, Any]:
        """Remove the ledger and the round file: a finished run is its results.json."""
        self.file.close()
        self.path.unlink(missing_ok=True)
        (self.path.parent / LAST_ROUND).unlink(missing_ok=True)
        return {}


def _rounds(path: Path, per_round: int) -> list[list[float]]:
    """The whole rounds ``path`` holds after its header, in order. A last line cut short by a
    kill is dropped; any other line that is not ``per_round`` numbers is refused by name."""
    if not path.is_file():
        return []
    rounds: list[list[float]] = []
    with path.open() as file:
        file.readline(LINE_LIMIT)
        for number, line in enumerate(iter(lambda: file.readline(LINE_LIMIT), ""), start=2):
            try:
                scalars = json.loads(line)
            except ValueError:
                scalars = None
            whole = (
                isinstance(scalars, list)
                and len(scalars) == per_round
                and all(isinstance(s, float | int) and not isinstance(s, bool) for s in scalars)
            )
            if whole:
                rounds.append([float(s) for s in scalars])
            elif line.endswith("\n"):
                raise CheckpointError(
                    f"{path} line {number} is not {per_round} numbers (one scalar per client "
                    "and local step): the ledger is damaged; run it again without --resume"
                )
    return rounds


def step_means(out: Path) -> list[float]:
    """Each step's mean |scalar| over the clients, from the scalar ledger in ``out``: what the
    divergence guard reads (benchmarks/guard_rule.py measures its margins on DZSGD runs)."""
    path = out / SCALARS
    try:
        config = RunConfig.model_validate(_read_header(path)["config"])
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable scalar ledger: {error}") from None
    n = config.clients
    scalars = [s for row in _rounds(path, n * config.steps_per_round) for s in row]
    return [sum(map(abs, scalars[i : i + n])) / n for i in range(0, len(scalars), n)]


def _read_header(path: Path) -> dict[str, Any]:
    """The ledger's first line; ValueError where it is not a format-``FORMAT`` header."""
    with path.open() as file:
        header = json.loads(file.readline(LINE_LIMIT))
    fields = {"format", "config", "data", "base_hash"}
    if not (isinstance(header, dict) and header.keys() >= fields and header["format"] == FORMAT):
        raise ValueError(f"{path} has no ledger header")
    return header


def header(out: Path) -> dict[str, Any] | None:
    """The config and data the scalar ledger in ``out`` was made under, or None where it has
    none that can be read."""
    try:
        return _read_header(out / SCALARS)
    except (OSError, ValueError):
        return None


def _check_header(path: Path, config: RunConfig, base: str, data: dict[str, int | str]) -> None:
    """Refuse a ledger made under another config, on other examples or from another start."""
    try:
        found = _read_header(path)
    except (OSError, ValueError):
        raise CheckpointError(
            f"{path}'s first line is not a format-{FORMAT} ledger header (config, data, "
            "base_hash): run it again without --resume"
        ) from None
    written, recorded, hashed = found["config"], found["data"], found["base_hash"]
    check_origin(f"the ledger {path}", written, recorded, config, data)
    if hashed != base:
        raise CheckpointError(
            f"the ledger {path} starts from a model hashing to {str(hashed)[:16]}…, not this "
            f"build's {base[:16]}…: run it again without --resume"
        )


def resume_from_scalars(
    out: Path,
    config: RunConfig,
    algorithm: Gossip,
    base: str,
    data: dict[str, int | str],
    replayed: Replayed = no_replay_report,
    start: int = 0,
) -> LedgerPoint | None:
    """Replay into ``algorithm``, built afresh or restored to round ``start`` from a checkpoint,
    the rounds from ``start`` up to the later of history.jsonl's last evaluation and
    ledger_round.json that the ledger holds whole; where it stands then, or None where there is
    nothing to resume from (no ledger, or no round beyond ``start``). ``replayed`` is told each
    round replayed, and the round it replays to."""
    path, history_file = out / SCALARS, out / "history.jsonl"
    if not (path.is_file() and history_file.is_file()):
        return None
    history = read_jsonl(history_file)
    if not history:
        return None
    _check_header(path, config, base, data)
    rounds = _rounds(path, config.clients * config.steps_per_round)
    point = resume_point(out, history, len(rounds))
    if start and point.round <= start:
        return None
    if point.round == 0:
        if history[-1]["round"] == 0:
            return None
        raise CheckpointError(
            f"{path} holds {len(rounds)} rounds, fewer than any evaluation {history_file} "
            "records needs: the ledger was cut; run it afresh"
        )
    for round_index in range(start, point.round):
        algorithm.replay_round(round_index, rounds[round_index])
        replayed(round_index + 1, point.round)
        if algorithm.stop_reason() and round_index + 1 < point.round:
            raise CheckpointError(
                f"{path} goes on to round {point.round}, but the divergence guard stops this run "
                f"after round {round_index + 1}: the ledger was made by code that did not guard "
                "DZSGD; run it again without --resume"
            )
    return point
