"""A run's examples: drawn from a built-in task's files (seedflood.learning.presets) or from the
user's own data (seedflood.learning.user_tasks) by the same protocol, then split across clients.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from seedflood.learning.examples import DataError, Example, TaskData
from seedflood.learning.presets import PRESETS, TASKS
from seedflood.learning.sources import Pool, dir_pools, hub_pools
from seedflood.learning.user_tasks import TaskSpec, load_user_splits

__all__ = ["TASKS", "DataError", "Example", "TaskData", "TaskSpec", "load_task", "partition"]

PARTITION_SCHEMES: tuple[str, ...] = ("uniform", "dirichlet")


def _take(
    pool: list[Example], sizes: Sequence[int], rng: np.random.Generator
) -> list[list[Example]]:
    """Disjoint random draws of the given sizes (fewer once the pool runs out), each put back in
    source order so that a run's examples can be read side by side with the files."""
    order = rng.permutation(len(pool))
    draws, start = [], 0
    for size in sizes:
        chosen = np.sort(order[start : start + size])
        start += len(chosen)
        draws.append([pool[i] for i in chosen])
    return draws


def data_dir_from_env() -> pathlib.Path | None:
    value = os.environ.get("SEEDFLOOD_DATA_DIR", "")
    return pathlib.Path(value) if value else None


def load_task(
    task: str | TaskSpec,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    n_train: int = 1024,
    n_val: int = 500,
    n_test: int = 1000,
) -> TaskData:
    """Sample disjoint train/val sets and a held-out test set; every shortfall becomes a note,
    because the few-shot data directories hold far fewer rows than the paper's protocol asks."""
    for name, size in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if size < 1:
            raise DataError(f"{name} must be >= 1, got {size}")
    if isinstance(task, TaskSpec):
        train_source, val_source, test_source, source, objective = load_user_splits(task)
        name = task.task_name
    elif task in PRESETS:
        root = pathlib.Path(data_dir) if data_dir is not None else data_dir_from_env()
        preset = PRESETS[task]
        pools = hub_pools(preset) if root is None else dir_pools(preset, root)
        train_source, val_source, test_source = pools
        source = f"hub:{'/'.join(preset.hub)}" if root is None else f"data_dir:{root}"
        name, objective = task, "classify"
    else:
        raise DataError(f"unknown task {task!r}; allowed: {', '.join(TASKS)}")
    train, val, test, notes = _sample(
        name, train_source, val_source, test_source, seed, (n_train, n_val, n_test)
    )
    return TaskData(name, train, val, test, notes, source, objective)


def _sample(
    task: str,
    train_source: Pool,
    val_source: Pool | None,
    test_source: Pool,
    seed: int,
    sizes: tuple[int, int, int],
) -> tuple[list[Example], list[Example], list[Example], list[str]]:
    n_train, n_val, n_test = sizes
    (train_from, train_pool), (test_from, test_pool) = train_source, test_source
    rng = np.random.default_rng(seed)
    if val_source is None:
        train, val = _take(train_pool, (n_train, n_val), rng)
        val_from = f"{train_from} after taking {len(train)} for training"
    else:
        val_from, val_pool = val_source
        (train,) = _take(train_pool, (n_train,), rng)
        (val,) = _take(val_pool, (n_val,), rng)
    (test,) = _take(test_pool, (n_test,), rng)

    notes = [
        f"{task}: only {len(got)} {split} examples available from {where}; "
        f"using {len(got)} instead of {wanted}"
        for split, got, wanted, where in (
            ("training", train, n_train, train_from),
            ("validation", val, n_val, val_from),
            ("test", test, n_test, test_from),
        )
        if len(got) < wanted
    ]
    return train, val, test, notes


def _dirichlet_shards(
    examples: Sequence[Example], n_clients: int, alpha: float, rng: np.random.Generator
) -> list[list[int]]:
    labels = np.array([example.label for example in examples])
    shards: list[list[int]] = [[] for _ in range(n_clients)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cuts = (np.cumsum(rng.dirichlet([alpha] * n_clients))[:-1] * len(members)).astype(int)
        for shard, part in zip(shards, np.split(members, cuts), strict=True):
            shard.extend(part.tolist())
    # A client with no data cannot take a step; the largest shard always has one to spare
    # because there are at least as many examples as clients.
    for empty in (shard for shard in shards if not shard):
        empty.append(max(shards, key=len).pop())
    return [rng.permutation(shard).tolist() for shard in shards]


def partition(
    examples: Sequence[Example],
    n_clients: int,
    *,
    seed: int = 0,
    scheme: str = "uniform",
    alpha: float = 0.5,
) -> list[list[Example]]:
    """Split training data across clients; "dirichlet" skews each client's label mix (smaller
    alpha, more skew) to model the non-IID data of a real decentralized deployment."""
    if scheme not in PARTITION_SCHEMES:
        raise DataError(
            f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_SCHEMES)}"
        )
    if n_clients < 1:
        raise DataError(f"n_clients must be >= 1, got {n_clients}")
    if n_clients > len(examples):
        raise DataError(
            f"{n_clients} clients but only {len(examples)} training examples: every client needs "
            "one; use fewer clients or more training data"
        )
    rng = np.random.default_rng(seed)
    if scheme == "uniform":
        shards = [
            part.tolist() for part in np.array_split(rng.permutation(len(examples)), n_clients)
        ]
    else:
        if not alpha > 0:
            raise DataError(f"alpha must be > 0, got {alpha}")
        shards = _dirichlet_shards(examples, n_clients, alpha, rng)
    return [[examples[i] for i in shard] for shard in shards]
