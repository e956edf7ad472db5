"""Checkpoints of a simulated run: enough to continue after a kill and end bit for bit where an
uninterrupted run ends.

A checkpoint is written at every evaluation and holds the loop's own progress (round, history,
seconds, zero-shot accuracy), the model's parameters and buffers, the global random generators,
and every attribute of the algorithm object. The algorithm is saved generically, so state that a
method gains later (a lossy link's generator, a clip window, repair counters) is covered without
touching this file: its attributes are pickled whole, except objects a fresh build recreates
identically from the config and that are large or unpicklable — the model and its modules,
parameters and buffers, the direction (pure caches over the model), the data shards. Those are
pickled as references and resolved, on resume, against a freshly built algorithm, so whatever
points at them (a list of parameters, a helper holding the model) points at the fresh ones. The
topology is small and pickled like any value: a partition may swap it for a cut graph mid-run.
Tensors are stored beside the pickle in one ``torch.save``, which keeps tensors that share memory
sharing it.

Rule for new algorithm state: anything that must alias the model (a view of a parameter's data)
has to be reachable through one of those rebuilt objects; everything else may be any picklable
value. Checkpoints are local files of this run, read with full unpickling: never resume from a
checkpoint someone else handed you.
"""

from __future__ import annotations

import io
import os
import pickle
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from seedflood import __version__
from seedflood.algorithms.common import Algorithm
from seedflood.config import ConfigError, RunConfig
from seedflood.files import atomic_write
from seedflood.learning.scoring import TokenizedExample
from seedflood.zo import DenseDirection, SubCGEDirection

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = 1

REBUILT_TYPES = (
    nn.Module,
    nn.Parameter,
    DenseDirection,
    SubCGEDirection,
    TokenizedExample,
)
"""Values a fresh build from the same config recreates identically (see the module docstring)."""

KILL_ROUND_VARIABLE = "SEEDFLOOD_FAULT_KILL_ROUND"
KILL_AT_VARIABLE = "SEEDFLOOD_FAULT_KILL_AT"
KILL_POINTS = ("round", "history", "checkpoint")
"""Where a test can kill a run after its round: before anything is written, between the history
file and the checkpoint, or after both."""

Token = tuple[str, str]


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: unreadable, or written by other code."""


@dataclass
class Progress:
    """The run loop's own state at a checkpoint."""

    round: int
    history: list[dict[str, Any]]
    train_seconds: float
    wall_seconds: float
    zero_shot_accuracy: float


def _rebuilt(value: Any) -> bool:
    if isinstance(value, REBUILT_TYPES):
        return True
    return isinstance(value, list | tuple) and bool(value) and all(map(_rebuilt, value))


def _references(algorithm: Algorithm) -> dict[int, tuple[Token, Any]]:
    """id → (token, object) of everything a fresh build recreates; the objects are kept so their
    ids stay valid while the pickler runs."""
    found: dict[int, tuple[Token, Any]] = {}

    def add(kind: str, name: str, value: Any) -> None:
        found.setdefault(id(value), ((kind, name), value))

    model = algorithm.model
    for name, module in model.named_modules(remove_duplicate=False):
        add("module", name, module)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        add("parameter", name, parameter)
    for name, buffer in model.named_buffers(remove_duplicate=False):
        add("buffer", name, buffer)
    for key, value in vars(algorithm).items():
        if _rebuilt(value):
            add("attribute", key, value)
    return found


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, references: dict[int, tuple[Token, Any]]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.references = references
        self.tensors: list[torch.Tensor] = []
        self.tensor_index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> tuple[str, Any] | None:
        if id(obj) in self.references:
            return self.references[id(obj)][0]
        if isinstance(obj, torch.Tensor):
            index = self.tensor_index.setdefault(id(obj), len(self.tensors))
            if index == len(self.tensors):
                self.tensors.append(obj)
            return ("tensor", index)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(
        self, file: io.BytesIO, references: dict[Token, Any], tensors: list[torch.Tensor]
    ) -> None:
        super().__init__(file)
        self.references = references
        self.tensors = tensors

    def persistent_load(self, pid: Any) -> Any:
        kind, key = pid
        if kind == "tensor":
            return self.tensors[key]
        if pid not in self.references:
            raise CheckpointError(
                f"the checkpoint refers to {kind} {key!r}, which this build does not have: it was "
                "written by other code"
            )
        return self.references[pid]


def _algorithm_state(algorithm: Algorithm) -> tuple[bytes, list[torch.Tensor], list[str]]:
    references = _references(algorithm)
    rebuilt = {token for token, _ in references.values() if token[0] == "attribute"}
    saved = {
        key: value for key, value in vars(algorithm).items() if ("attribute", key) not in rebuilt
    }
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, references)
    pickler.dump(saved)
    return buffer.getvalue(), pickler.tensors, sorted(key for _, key in rebuilt)


def _model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and every buffer, non-persistent ones included: ``state_dict`` skips those."""
    return {
        **{f"parameter:{n}": p.detach() for n, p in model.named_parameters()},
        **{f"buffer:{n}": b for n, b in model.named_buffers()},
    }


def save_checkpoint(
    path: str | os.PathLike, config: RunConfig, progress: Progress, algorithm: Algorithm
) -> None:
    """Write atomically: a kill during the write leaves the previous checkpoint in place."""
    pickled, tensors, rebuilt = _algorithm_state(algorithm)
    state = {
        "format": FORMAT,
        "version": __version__,
        "config": config.model_dump(mode="json"),
        "progress": asdict(progress),
        "model": _model_state(algorithm.model),
        "algorithm": pickled,
        "tensors": tensors,
        "rebuilt": rebuilt,
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }
    atomic_write(path, lambda file: torch.save(state, file))


def config_differences(stored: dict[str, Any], config: RunConfig) -> list[str]:
    """Keys whose values differ, read through RunConfig so keys added since count at defaults."""
    try:
        then = RunConfig(**stored).model_dump(mode="json")
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"the checkpoint's config is not a valid run config: {error}"
        ) from None
    now = config.model_dump(mode="json")
    return [
        f"{key} (checkpoint {then[key]!r}, now {now[key]!r})"
        for key in now
        if then[key] != now[key]
    ]


def load_checkpoint(path: str | os.PathLike, config: RunConfig, algorithm: Algorithm) -> Progress:
    """Put ``algorithm`` (freshly built from ``config``) and the global generators back where the
    checkpoint left them; the progress says where the loop goes on.

    The file is read through a memory map and the saved state copied into the fresh build's
    tensors where it can (``_into_memory``): resuming then peaks at one copy of the state, not
    two. A 16-client full-parameter gossip run holds 8.6 GB of models, and reading the file whole
    beside the fresh build needed twice that (ChocoSGD, with 17 GB, would need about 34 GB)."""
    try:
        state = torch.load(path, weights_only=False, mmap=True)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a format-{FORMAT} seedflood checkpoint")
    differences = config_differences(state["config"], config)
    if differences:
        raise ConfigError(
            f"checkpoint {path} was written with another config; differing keys: "
            f"{'; '.join(differences)}. Resume with the checkpoint's config, or run without "
            "--resume to start afresh"
        )
    references = {token: value for token, value in _references(algorithm).values()}
    rebuilt = sorted(key for kind, key in references if kind == "attribute")
    if rebuilt != state["rebuilt"]:
        raise CheckpointError(
            f"checkpoint {path} rebuilds attributes {state['rebuilt']}, this code {rebuilt}: it "
            f"was written by other code (version {state['version']}, now {__version__})"
        )
    model_state = _model_state(algorithm.model)
    if sorted(model_state) != sorted(state["model"]):
        raise CheckpointError(f"checkpoint {path} holds another model's parameters")
    with torch.no_grad():
        for name, tensor in model_state.items():
            tensor.copy_(state["model"][name])
    # A sparse tensor (a mixing matrix) cannot be moved off the map in place: it is copied whole.
    tensors = [t if t.layout == torch.strided else t.clone() for t in state["tensors"]]
    saved = _Unpickler(io.BytesIO(state["algorithm"]), references, tensors).load()
    _into_memory(tensors, saved, vars(algorithm))
    vars(algorithm).update(saved)
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return Progress(**state["progress"])


def _into_memory(tensors: list[torch.Tensor], saved: dict[str, Any], fresh: dict[str, Any]) -> None:
    """Copy every memory-mapped dense CPU tensor of the checkpoint into memory, in place (whoever
    holds the tensor sees the copy); tensors that shared a storage share its copy. A saved
    attribute whose fresh build holds a CPU storage of the same size is copied into that storage,
    so the build's state is reused rather than kept beside a second copy, and whatever the build
    pointed at it (gossip binds the model's parameters to a row of its models) sees the saved
    values."""
    homes: dict[int, torch.UntypedStorage] = {}
    taken: set[int] = set()
    for key, value in saved.items():
        built = fresh.get(key)
        if not (
            isinstance(value, torch.Tensor)
            and isinstance(built, torch.Tensor)
            and value.layout == built.layout == torch.strided
        ):
            continue
        source, target = value.untyped_storage(), built.untyped_storage()
        if (
            value.device.type == built.device.type == "cpu"
            and 0 < source.nbytes() == target.nbytes()
            and source.data_ptr() not in homes
            and target.data_ptr() not in taken
        ):
            target.copy_(source)
            homes[source.data_ptr()] = target
            taken.add(target.data_ptr())
    for tensor in tensors:
        if tensor.layout != torch.strided or tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            continue
        home = homes.get(storage.data_ptr())
        if home is None:
            home = homes[storage.data_ptr()] = storage.clone()
        with torch.no_grad():
            tensor.set_(home, tensor.storage_offset(), tensor.size(), tensor.stride())


def kill_point() -> tuple[int, str] | None:
    """The (round, point) at which a test asked this process to die, from the environment."""
    round_text = os.environ.get(KILL_ROUND_VARIABLE)
    if round_text is None:
        return None
    point = os.environ.get(KILL_AT_VARIABLE, "round")
    if not round_text.isdigit() or point not in KILL_POINTS:
        raise ConfigError(
            f"{KILL_ROUND_VARIABLE}={round_text!r} {KILL_AT_VARIABLE}={point!r}: the round must be "
            f"a whole number and the point one of {', '.join(KILL_POINTS)}"
        )
    return int(round_text), point


def maybe_kill(requested: tuple[int, str] | None, done: int, point: str) -> None:
    """Die as a SIGKILL would, without cleanup, flushing or exception handlers."""
    if requested == (done, point):
        os._exit(137)


def checkpoint_path(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / CHECKPOINT_NAME
