"""A simulated run's scalars as TensorBoard event files in ``OUT/tensorboard``.

history.jsonl stays the run's record; these files repeat each of its evaluations (plus the
learning rate and the seconds per step) in the format training dashboards read, so a run can be
watched live with ``tensorboard --logdir OUT`` and summarised afterwards by `seedflood report`.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from seedflood.config import RunConfig
from seedflood.learning.schedules import lr_schedule

log = logging.getLogger(__name__)

BOARD = "tensorboard"
"""The event files' folder in a run's directory."""

TAGS = {  # a history.jsonl field → its TensorBoard tag, written where an evaluation has the field
    "train_loss": "train/loss",
    "accuracy": "validation/accuracy",
    "eval_loss": "validation/loss",
    "perplexity": "validation/perplexity",
    "bytes_per_edge_mean": "traffic/bytes_per_edge_mean",
    "bytes_per_edge_max": "traffic/bytes_per_edge_max",
    "consensus_distance": "consensus/distance",
}
LEARNING_RATE = "train/learning_rate"
SECONDS_PER_STEP = "time/seconds_per_step"


class Tracker:
    """Writes each evaluation as the run records it, global step = the round. Events are
    flushed at once (evaluations are rare, and a killed run must not lose what history.jsonl
    holds); use it as a context manager so that the file is closed however the run ends."""

    def __init__(self, out: Path, config: RunConfig) -> None:
        self.directory = out / BOARD
        self.rate = lr_schedule(config)
        self.steps_per_round = config.steps_per_round
        self.writer: SummaryWriter | None = None

    def log(self, history: list[dict[str, Any]]) -> None:
        """Write the last evaluation of ``history``; the one before it, if any, times the steps
        in between and gives the rate of the last of them."""
        entry = history[-1]
        done = entry["round"]
        writer = self.writer or self._open(done)
        for field, tag in TAGS.items():
            if field in entry:
                writer.add_scalar(tag, entry[field], done)
        if len(history) > 1:
            before = history[-2]
            steps = (done - before["round"]) * self.steps_per_round
            seconds = entry["train_seconds"] - before["train_seconds"]
            writer.add_scalar(LEARNING_RATE, self.rate(done * self.steps_per_round - 1), done)
            writer.add_scalar(SECONDS_PER_STEP, seconds / steps, done)
        writer.flush()

    def _open(self, first_round: int) -> SummaryWriter:
        """A run started afresh replaces the old files; a resumed one purges (hides from
        TensorBoard) what an interrupted session wrote from ``first_round`` on, which it writes
        again, so that each round is shown once."""
        if first_round == 0:
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            log.debug(
                "TensorBoard: hiding what %s held from round %d on", self.directory, first_round
            )
        self.writer = SummaryWriter(str(self.directory), purge_step=first_round or None)
        return self.writer

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.writer is not None:
            self.writer.close()


def read_board(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each scalar's (step, value) points as TensorBoard shows them (purged points left out);
    no scalars where the run wrote no event files."""
    if not (run_dir / BOARD).is_dir():
        return {}
    events = EventAccumulator(str(run_dir / BOARD), size_guidance={SCALARS: 0})  # 0: keep all
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()[SCALARS]
    }


def plot_board(run_dir: Path, path: Path) -> bool:
    """One panel per scalar of the run's event files, by round, in the PNG ``path``; False, and
    no file, where there are none."""
    scalars = read_board(run_dir)
    if not scalars:
        return False
    columns = min(3, len(scalars))
    rows = math.ceil(len(scalars) / columns)
    figure = Figure(figsize=(4.5 * columns, 3.2 * rows), layout="tight")
    for index, (tag, points) in enumerate(sorted(scalars.items()), start=1):
        axis = figure.add_subplot(rows, columns, index)
        axis.plot([step for step, _ in points], [value for _, value in points], "o-", ms=3)
        axis.set_title(tag, fontsize=10)
        axis.set_xlabel("round")
        axis.grid(True, alpha=0.3)
    figure.savefig(path, dpi=120)
    return True
