"""Grids of runs: the cartesian product of variants and swept keys, resumable.

A grid file::

    base: ../quickstart.yaml        # optional run config the grid starts from (relative path)
    common: {eval_every: 10}        # overrides for every run
    variants:                       # name → overrides; each variant is one method setting
      seedflood: {method: seedflood, lr: 0.01}
      dsgd-lora: {method: dsgd, lora: true, lr: 0.05}
      dsgd: {method: dsgd, grid: {clients: [16]}}   # a variant may narrow the sweep
    grid:                           # every combination of these values
      topology: [ring, meshgrid]
      clients: [16]
      seed: [0, 1, 2]

Every run's config is validated before the first one starts, so a typo in the last variant does not
surface an hour in. A run whose results.json exists with the same config is skipped, and a run
killed half-way continues from its last checkpoint (see seedflood.sim.checkpoint): an interrupted
comparison resumes where it stopped, to the round. Processes that share a grid's directory claim
each run before starting it (``claimed``), so two of them never run the same one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from seedflood.build import run_data
from seedflood.config import ConfigError, RunConfig, load_config
from seedflood.learning.examples import DataError

GRID_KEYS = ("base", "common", "variants", "grid")


@dataclass(frozen=True)
class PlannedRun:
    name: str
    config: RunConfig

    def directory(self, out: Path) -> Path:
        return out / "runs" / self.name

    def finished_results(self, out: Path) -> dict[str, Any] | None:
        """The results of an earlier run with exactly this configuration and data, else None."""
        results = self.results_with_config(out)
        return results if results is not None and same_data(results, self.config) else None

    def results_with_config(self, out: Path) -> dict[str, Any] | None:
        """The results of an earlier run with exactly this configuration on whatever data it
        had, else None."""
        path = self.directory(out) / "results.json"
        if not path.is_file():
            return None
        try:
            results = json.loads(path.read_text())
            stored = RunConfig(**results["config"])
        except (json.JSONDecodeError, KeyError, TypeError, ValidationError):
            return None
        # Through RunConfig, so keys added since the run was made count at their defaults.
        return results if stored == self.config else None

    def is_done(self, out: Path) -> bool:
        return self.finished_results(out) is not None


NOTE = re.compile(r"only (\d+) (training|validation|test) examples available")
SPLITS = {"training": "train", "validation": "val", "test": "test"}
_identities: dict[tuple[Any, ...], dict[str, int | str] | None] = {}


def data_identity(config: RunConfig) -> dict[str, int | str] | None:
    """The identity (`TaskData.identity`) of the examples ``config`` draws from the data as it
    is now, or None where that cannot be told offline: a built-in task read from the hub, or data
    that cannot be read (the run itself will say why). Drawn once per task, sizes and state of
    the data directory's files."""
    directory = config.resolved_data_dir()
    key = (
        json.dumps(config.task, sort_keys=True, default=str),
        directory,
        _files_state(Path(directory)) if directory else (),
        config.seed,
        config.n_train,
        config.n_val,
        config.n_test,
    )
    if key not in _identities:
        hub = isinstance(config.task, str) and directory is None
        try:
            _identities[key] = None if hub else run_data(config).identity()
        except (DataError, OSError):
            _identities[key] = None
    return _identities[key]


def _files_state(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file under ``directory`` with its size and modification time: a file replaced or
    edited since the identity was drawn makes it be drawn again."""
    found = []
    for path in sorted(directory.rglob("*")) if directory.is_dir() else []:
        if path.is_file():
            state = path.stat()
            found.append((str(path), state.st_size, state.st_mtime_ns))
    return tuple(found)


def same_data(results: dict[str, Any], config: RunConfig) -> bool:
    """Whether a finished run trained on the examples ``config`` draws now. Results record what
    they trained on (``data``); older ones only their shortfalls (``data_notes``), whose counts
    are compared instead: the RTE grid made on 32 training rows is not done once 2,490 exist."""
    current = data_identity(config)
    if current is None:
        return True
    recorded = results.get("data")
    if recorded is not None:
        return recorded == current
    counts = {"train": config.n_train, "val": config.n_val, "test": config.n_test}
    for note in results.get("data_notes", []):
        if found := NOTE.search(note):
            counts[SPLITS[found[2]]] = int(found[1])
    return all(counts[split] == current[split] for split in counts)


LOCK_NAME = "running.lock"


@contextmanager
def claimed(directory: Path) -> Iterator[str | None]:
    """Hold ``directory``'s run for this process while the block runs: yields None once claimed,
    or who holds it ("pid N on HOST") when another live process does.

    Processes that split a grid (``--only``) can pick the same run by mistake; two of them
    writing one checkpoint corrupt it. The claim is a lock file created exclusively; one left by
    a process that died on this host is taken over, and one from another host is respected
    (its process cannot be checked from here: delete the file if that machine is gone).
    """
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / LOCK_NAME
    me = f"{os.getpid()} {socket.gethostname()}"
    while True:
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = lock.read_text() if lock.is_file() else ""
            if holder and _alive(holder):
                yield f"pid {holder.replace(' ', ' on ', 1)}"
                return
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(descriptor, "w") as file:
            file.write(me)
        break
    try:
        yield None
    finally:
        lock.unlink(missing_ok=True)


def _alive(holder: str) -> bool:
    """Whether the process named by a lock's "PID HOST" still runs (always, for another host)."""
    pid_text, _, host = holder.partition(" ")
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid_text), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of keys to values, got {value!r}")
    return value


def plan(
    grid_file: str | Path,
    only: Sequence[str] = (),
    where: Mapping[str, Sequence[str]] | None = None,
) -> list[PlannedRun]:
    """Every run of a grid file, validated, in a fixed order; with ``only``, the runs of those
    variants, and with ``where`` (config key → values as text), the runs whose config takes one
    of the values at every key named: one grid can then be split between processes or machines
    that share its directory, in the order the decisive cells need, under the grid's own names."""
    path = Path(grid_file)
    if not path.is_file():
        raise ConfigError(f"grid file not found: {path}")
    try:
        spec = _mapping(yaml.safe_load(path.read_text()), str(path))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    unknown = sorted(set(spec) - set(GRID_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed: {', '.join(GRID_KEYS)}")
    base = (path.parent / spec["base"]) if spec.get("base") else None
    common = _mapping(spec.get("common"), "common")
    variants = _mapping(spec.get("variants"), "variants") or {"run": {}}
    unknown = sorted(set(only) - set(variants))
    if unknown:
        raise ConfigError(
            f"--only names variant(s) {unknown} that {path} lacks; its variants: "
            f"{', '.join(variants)}"
        )
    if only:
        variants = {name: value for name, value in variants.items() if name in only}
    sweep = _mapping(spec.get("grid"), "grid")
    runs = []
    for variant, overrides in variants.items():
        own = dict(_mapping(overrides, f"variant {variant}"))
        own_sweep = {**sweep, **_mapping(own.pop("grid", None), f"variant {variant}: grid")}
        for key, values in own_sweep.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"grid key '{key}' needs a non-empty list of values")
        for combination in itertools.product(*own_sweep.values()):
            chosen = dict(zip(own_sweep, combination, strict=True))
            settings = {"label": variant, **common, **own, **chosen}
            try:
                config = load_config(base, values=settings)
            except ConfigError as error:
                raise ConfigError(f"variant '{variant}' with {chosen}: {error}") from None
            suffix = "_".join(f"{key}-{value}" for key, value in chosen.items())
            runs.append(PlannedRun(f"{variant}_{suffix}" if suffix else variant, config))
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise ConfigError("two runs of the grid share a name: variant names must be unique")
    return _matching(runs, where or {})


def _matching(runs: list[PlannedRun], where: Mapping[str, Sequence[str]]) -> list[PlannedRun]:
    unknown = sorted(set(where) - set(RunConfig.model_fields))
    if unknown:
        raise ConfigError(
            f"--where names unknown config key(s) {unknown}; allowed: "
            f"{', '.join(sorted(RunConfig.model_fields))}"
        )
    chosen = [
        run
        for run in runs
        if all(_as_text(getattr(run.config, key)) in values for key, values in where.items())
    ]
    if runs and not chosen:
        present = {
            key: sorted({_as_text(getattr(run.config, key)) for run in runs}) for key in where
        }
        raise ConfigError(
            "--where matches no run of the grid; its runs take "
            + "; ".join(f"{key} in {values}" for key, values in present.items())
        )
    return chosen


def _as_text(value: Any) -> str:
    """A config value as a user types it on the command line, in YAML's words (`lora=true`,
    `hops=null`, `seed=1`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_where(conditions: Sequence[str]) -> dict[str, list[str]]:
    """``["seed=1,2", "clients=16"]`` → ``{"seed": ["1", "2"], "clients": ["16"]}``."""
    where: dict[str, list[str]] = {}
    for condition in conditions:
        key, equals, values = condition.partition("=")
        chosen = [value.strip() for value in values.split(",") if value.strip()]
        if not equals or not key.strip() or not chosen:
            raise ConfigError(
                f"--where {condition!r}: expected KEY=VALUE[,VALUE...], e.g. seed=1,2"
            )
        where.setdefault(key.strip(), []).extend(chosen)
    return where
