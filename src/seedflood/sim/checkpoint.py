"""Checkpoints of a simulated run: enough to continue after a kill and end bit for bit where an
uninterrupted run ends.

A checkpoint is written at every evaluation and holds the loop's own progress (round, history,
seconds, zero-shot accuracy), the model's parameters and buffers, the global random generators,
and every attribute of the algorithm object. The algorithm is saved generically, so state that a
method gains later (a lossy link's generator, a clip window, repair counters) is covered without
touching this file: its attributes are written whole as plain data (`seedflood.sim.plain_state`),
except objects a fresh build recreates identically from the config and that are large or
unpicklable — the model and its modules, parameters and buffers, the direction (pure caches over
the model), the data shards. Those are written as references and resolved, on resume, against a
freshly built algorithm, so whatever points at them (a list of parameters, a helper holding the
model) points at the fresh ones. The topology is small and written like any value: a partition
may swap it for a cut graph mid-run. Tensors are stored beside the tree in one file, which keeps
tensors that share memory sharing it.

Rule for new algorithm state: anything that must alias the model (a view of a parameter's data)
has to be reachable through one of those rebuilt objects; everything else must be plain data,
tensors, numpy arrays, random generators or objects of seedflood's own classes. The file is
sealed (`seedflood.learning.sealed`): loaded with ``weights_only=True``, so a checkpoint
someone handed you runs no code, and checked against its SHA-256, so a damaged one is refused
(and the run resumes from its ledger where it can) instead of resuming on another model.
"""

from __future__ import annotations

import os
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
from seedflood.learning.scoring import TokenizedExample
from seedflood.learning.sealed import (
    DamagedFileError,
    SealedFileError,
    load_sealed,
    peek_sealed,
    save_sealed,
)
from seedflood.sim.plain_state import Decoder, Encoder, PlainStateError, Token
from seedflood.zo import DenseDirection, SubCGEDirection

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = 2
FIELDS = {"version", "config", "progress", "model", "algorithm", "rng", "tensors", "rebuilt"}

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


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: unreadable, or written by other code."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint whose bytes changed after it was written (or that was cut short): the run's
    ledger, where it has one, still holds the run."""


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
    ids stay valid while the encoder runs."""
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


def _algorithm_state(algorithm: Algorithm, encoder: Encoder) -> tuple[Any, list[str]]:
    rebuilt = {token for token, _ in encoder.references.values() if token[0] == "attribute"}
    saved = {
        key: value for key, value in vars(algorithm).items() if ("attribute", key) not in rebuilt
    }
    return encoder.encode(saved, "algorithm"), sorted(key for _, key in rebuilt)


def _model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and every buffer, non-persistent ones included: ``state_dict`` skips those."""
    return {
        **{f"parameter:{n}": p.detach() for n, p in model.named_parameters()},
        **{f"buffer:{n}": b for n, b in model.named_buffers()},
    }


def save_checkpoint(
    path: str | os.PathLike,
    config: RunConfig,
    progress: Progress,
    algorithm: Algorithm,
    data: dict[str, int | str] | None = None,
) -> None:
    """Write atomically: a kill during the write leaves the previous checkpoint in place.
    ``data`` is the identity of the examples the run trains on (`TaskData.identity`)."""
    encoder = Encoder(_references(algorithm))
    encoded, rebuilt = _algorithm_state(algorithm, encoder)
    rng = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    state = {
        "format": FORMAT,
        "version": __version__,
        "config": config.model_dump(mode="json"),
        "progress": asdict(progress),
        "model": _model_state(algorithm.model),
        "algorithm": encoded,
        "rng": encoder.encode(rng, "rng"),
        "tensors": encoder.tensors,
        "rebuilt": rebuilt,
        **({"data": data} if data is not None else {}),
    }
    save_sealed(path, state)


def data_difference(recorded: Any, data: dict[str, int | str] | None) -> str | None:
    """How the examples a checkpoint or ledger recorded differ from ``data``, the run's now, in
    words; None where they agree, or where either is unknown (written before runs recorded it)."""
    if recorded is None or data is None or recorded == data:
        return None

    def words(identity: Any) -> str:
        if not isinstance(identity, dict):
            return repr(identity)
        counts = ", ".join(f"{identity.get(s)} {s}" for s in ("train", "val", "test"))
        return f"{counts}, sha256 {str(identity.get('sha256', ''))[:12]}"

    return f"then {words(recorded)}, now {words(data)}"


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


def _read(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's content, checked against its checksum; nothing in it runs code."""
    try:
        state = load_sealed(path, mmap=True)
    except DamagedFileError as error:
        raise CheckpointDamaged(
            f"checkpoint {error}; delete it to resume from the run's ledger, or run without "
            "--resume"
        ) from None
    except SealedFileError as error:
        raise CheckpointError(
            f"checkpoint {error}: refusing to resume from it (checkpoints before format "
            f"{FORMAT} were pickles); delete it, or run without --resume"
        ) from None
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from None
    if state.get("format") != FORMAT or not state.keys() >= FIELDS:
        raise CheckpointError(f"{path} is not a format-{FORMAT} seedflood checkpoint")
    return state


def checkpoint_round(path: str | os.PathLike) -> int | None:
    """The round the checkpoint at ``path`` was written after, read without its checksum, or
    None where it says none: to choose between it and a ledger that may reach further (history
    is written before the checkpoint, so a kill between them leaves an older one), never to
    resume from."""
    content = peek_sealed(path)
    progress = content.get("progress") if content is not None else None
    done = progress.get("round") if isinstance(progress, dict) else None
    return done if type(done) is int else None


def _check_model(path: str | os.PathLike, state: dict[str, Any], model: nn.Module) -> None:
    fresh = {name: tensor.shape for name, tensor in _model_state(model).items()}
    saved = {name: tensor.shape for name, tensor in state["model"].items()}
    if fresh != saved:
        raise CheckpointError(f"checkpoint {path} holds another model's parameters")


def load_checkpoint(
    path: str | os.PathLike,
    config: RunConfig,
    algorithm: Algorithm,
    data: dict[str, int | str] | None = None,
) -> Progress:
    """Put ``algorithm`` (freshly built from ``config``) and the global generators back where the
    checkpoint left them; the progress says where the loop goes on. A checkpoint of another config
    or of other examples than ``data`` identifies is refused. Every check runs before
    ``algorithm`` is touched, so after a refusal it is still the fresh build (a damaged
    checkpoint can then be passed over for the ledger).

    The file is read through a memory map and the saved state copied into the fresh build's
    tensors where it can (``_into_memory``): resuming then peaks at one copy of the state, not
    two. A 16-client full-parameter gossip run holds 8.6 GB of models, and reading the file whole
    beside the fresh build needed twice that (ChocoSGD, with 17 GB, would need about 34 GB)."""
    state = _read(path)
    differences = config_differences(state["config"], config)
    if differences:
        raise ConfigError(
            f"checkpoint {path} was written with another config; differing keys: "
            f"{'; '.join(differences)}. Resume with the checkpoint's config, or run without "
            "--resume to start afresh"
        )
    changed = data_difference(state.get("data"), data)
    if changed:
        raise ConfigError(
            f"checkpoint {path} was written by a run on other data ({changed}): the data files "
            "changed since; run without --resume to start afresh"
        )
    references = {token: value for token, value in _references(algorithm).values()}
    rebuilt = sorted(key for kind, key in references if kind == "attribute")
    if rebuilt != state["rebuilt"]:
        raise CheckpointError(
            f"checkpoint {path} rebuilds attributes {state['rebuilt']}, this code {rebuilt}: it "
            f"was written by other code (version {state['version']}, now {__version__})"
        )
    _check_model(path, state, algorithm.model)
    # A sparse tensor (a mixing matrix) cannot be moved off the map in place: it is copied whole.
    tensors = [t if t.layout == torch.strided else t.clone() for t in state["tensors"]]
    decoder = Decoder(references, tensors)
    try:
        saved, rng = decoder.decode(state["algorithm"]), decoder.decode(state["rng"])
    except (PlainStateError, KeyError, TypeError, ValueError, AttributeError, ImportError) as error:
        raise CheckpointError(
            f"checkpoint {path} holds algorithm state this code cannot rebuild: {error}"
        ) from None
    with torch.no_grad():
        for name, tensor in _model_state(algorithm.model).items():
            tensor.copy_(state["model"][name])
    _into_memory(tensors, saved, vars(algorithm))
    vars(algorithm).update(saved)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
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


CHECKPOINTS_VARIABLE = "SEEDFLOOD_CHECKPOINTS"


def checkpoints_wanted() -> bool:
    """Whether evaluations write checkpoints ($SEEDFLOOD_CHECKPOINTS: on, the default, or off).

    An execution setting, like the device: a run on a lent GPU cannot carry its checkpoint away
    (16 full models are 8.6 GB), so there each write only costs time. SeedFlood runs resume from
    their ledger without one."""
    value = os.environ.get(CHECKPOINTS_VARIABLE, "").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ConfigError(
            f"{CHECKPOINTS_VARIABLE}={value!r}: use 'on' (evaluations write a checkpoint that "
            "--resume continues from) or 'off' (none: a killed first-order run starts over)"
        )
    return value == "on"


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
