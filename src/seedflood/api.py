"""The Python API: what `seedflood run`, `compare` and `replay` do, from a script or a notebook.

    from seedflood import RunConfig, train

    result = train(RunConfig(model="tiny", rounds=20), out="results/mine", quiet=True)
    result.metrics["accuracy"]      # results.json
    result.history[-1]              # the last evaluation in history.jsonl
    result.model                    # the trained model, a transformers model

A result reads what the run wrote to ``out``, so it is the same whether the run happened just now,
in another process, or through the command line. The model is loaded from ``out/model`` on first
use (the run's final weights exactly: see tests/sim/test_ledger.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from seedflood.config import RunConfig, load_config
from seedflood.files import read_jsonl
from seedflood.grid import claimed, plan
from seedflood.report import write_report
from seedflood.ui import progress as progress_bar

Progress = Callable[[int, dict[str, Any]], None]


@dataclass
class RunResult:
    out: Path
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    _model: nn.Module | None = field(default=None, repr=False)

    @property
    def model(self) -> nn.Module:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            path = self.out / "model"
            if not (path / "config.json").is_file():
                raise FileNotFoundError(
                    f"{path} holds no model: the run was made with save_model: false"
                )
            self._model = AutoModelForCausalLM.from_pretrained(path)
        return self._model

    @classmethod
    def read(cls, out: str | Path) -> RunResult:
        out = Path(out)
        metrics = json.loads((out / "results.json").read_text())
        history = read_jsonl(out / "history.jsonl") if (out / "history.jsonl").is_file() else []
        return cls(out, metrics, history)


def as_config(
    config: RunConfig | str | Path | Mapping[str, Any], overrides: Sequence[str] = ()
) -> RunConfig:
    """A RunConfig from itself, a YAML file, or a mapping of keys; ``overrides`` as --set takes."""
    if isinstance(config, RunConfig):
        return load_config(None, overrides, config.model_dump()) if overrides else config
    if isinstance(config, Mapping):
        return load_config(None, overrides, dict(config))
    return load_config(config, overrides)


@contextmanager
def _shown(label: str, total: int, quiet: bool) -> Iterator[Progress]:
    """A progress bar of rounds with the last validation accuracy; nothing when quiet."""
    if quiet:
        yield lambda _done, _record: None
        return
    with progress_bar(label) as bar:
        task = bar.add_task(label, total=total, status="loading model and data")

        def show(done: int, record: dict[str, Any]) -> None:
            status = f"val acc {record['accuracy']:.3f}" if "accuracy" in record else ""
            bar.update(task, completed=done, status=status)

        yield show


def train(
    config: RunConfig | str | Path | Mapping[str, Any],
    out: str | Path,
    *,
    overrides: Sequence[str] = (),
    resume: bool = False,
    quiet: bool = False,
) -> RunResult:
    """Train as `seedflood run CONFIG --out OUT` does; ``quiet`` shows no progress."""
    from seedflood.sim.runner import run

    config = as_config(config, overrides)
    with _shown("round", config.rounds, quiet) as show:
        run(config, out, show, resume=resume)
    return RunResult.read(out)


@dataclass
class CompareResult:
    runs: dict[str, RunResult]  # by run name, as under OUT/runs/
    report: Path


def compare(
    grid_file: str | Path,
    out: str | Path | None = None,
    *,
    only: Sequence[str] = (),
    where: Mapping[str, Sequence[str]] | None = None,
    quiet: bool = False,
) -> CompareResult:
    """Every run of a grid as `seedflood compare` makes them: finished runs are read, not rerun,
    and an interrupted one resumes from its checkpoint. Runs another process holds are left
    out of ``runs``; ``only`` and ``where`` narrow the grid as `--only` and `--where` do."""
    from seedflood.sim.runner import run

    out_dir = Path(out) if out is not None else Path("results") / Path(grid_file).stem
    runs: dict[str, RunResult] = {}
    for planned in plan(grid_file, only, where):
        directory = planned.directory(out_dir)
        with claimed(directory) as holder:
            if holder is None and not planned.is_done(out_dir):
                with _shown(planned.name, planned.config.rounds, quiet) as show:
                    run(planned.config, directory, show, resume=True)
            if holder is None:
                runs[planned.name] = RunResult.read(directory)
    return CompareResult(runs, write_report([out_dir], out_dir))


@dataclass
class ReplayResult:
    out: Path | None
    metrics: dict[str, Any]  # messages replayed and the state hash reached (the run's)
    model: nn.Module


def replay(run_dir: str | Path, out: str | Path | None = None) -> ReplayResult:
    """The model of a SeedFlood run rebuilt from its ledger alone, as `seedflood replay` does;
    saved to ``out`` when given."""
    from seedflood.sim.replay import rebuild

    model, metrics = rebuild(Path(run_dir), Path(out) if out is not None else None)
    return ReplayResult(Path(out) if out is not None else None, metrics, model)
