"""A checkpoint is plain data under a checksum: a crafted one runs no code and is refused by
name, a damaged one is refused before it touches the build, and a SeedFlood run whose checkpoint
is damaged resumes from its ledger and ends on the uninterrupted run's state hash."""

from __future__ import annotations

import collections
import functools
import json
import os
import pickle
import random
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from seedflood.config import ConfigError, load_config
from seedflood.files import read_jsonl
from seedflood.learning.schedules import Schedule
from seedflood.learning.sealed import load_sealed, save_sealed
from seedflood.protocol.messages import Message
from seedflood.sim import runner
from seedflood.sim.checkpoint import (
    CHECKPOINT_NAME,
    CHECKPOINTS_VARIABLE,
    KILL_AT_VARIABLE,
    KILL_ROUND_VARIABLE,
    CheckpointDamaged,
    CheckpointError,
    Progress,
    checkpoint_round,
    load_checkpoint,
    save_checkpoint,
)
from seedflood.sim.ledger import LAST_ROUND
from seedflood.sim.plain_state import Decoder, Encoder, PlainStateError
from seedflood.sim.replay import replay
from seedflood.sim.runner import build, run
from tests.sim.test_ledger import QUICKSTART, SETTINGS

pytestmark = pytest.mark.usefixtures("one_thread")
PROGRESS = Progress(1, [{"round": 1}], 0.5, 0.75, 0.5)


def config(data_dir: Path, *extra: str):
    return load_config(QUICKSTART, [*SETTINGS, f"data_dir={data_dir}", *extra])


def round_trip(value: Any, tmp_path: Path) -> Any:
    encoder = Encoder({})
    sealed = {"tree": encoder.encode(value, "value"), "tensors": encoder.tensors}
    save_sealed(tmp_path / "state.pt", sealed)
    loaded = load_sealed(tmp_path / "state.pt")
    return Decoder({}, loaded["tensors"]).decode(loaded["tree"])


def test_algorithm_state_comes_back_from_plain_data(tmp_path: Path) -> None:
    shared = [1, 2]
    generator = random.Random(3)
    numpy_generator = np.random.default_rng(5)
    cycle: list[Any] = ["self"]
    cycle.append(cycle)
    schedule = Schedule(0.5, "cosine", warmup=2, total=10)
    schedule(3)  # builds the multiplier function, which is not saved
    value = {
        (0, 1): Message(3, 1, 0.25),
        "shared": [shared, shared],
        "kinds": (collections.Counter("aab"), collections.deque([1, 2], maxlen=3), {4}),
        "frozen": frozenset({"x"}),
        "bytes": b"\x00\xff",
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "scalar": np.float32(1.5),
        "random": generator,
        "numpy": numpy_generator,
        "cycle": cycle,
        "schedule": schedule,
        "tensor": torch.arange(4.0),
    }
    back = round_trip(value, tmp_path)
    assert back[(0, 1)] == Message(3, 1, 0.25)
    assert back["shared"][0] is back["shared"][1] and back["shared"][0] == [1, 2]
    assert back["kinds"] == (collections.Counter("aab"), collections.deque([1, 2]), {4})
    assert back["kinds"][1].maxlen == 3 and back["frozen"] == frozenset({"x"})
    assert back["bytes"] == b"\x00\xff" and back["scalar"].dtype == np.float32
    assert np.array_equal(back["array"], value["array"]) and back["array"].dtype == np.uint32
    assert back["random"].random() == generator.random()
    assert back["numpy"].integers(1 << 62) == numpy_generator.integers(1 << 62)
    assert back["cycle"][1] is back["cycle"]
    assert back["schedule"](7) == schedule(7) and back["schedule"](7) != 0.5
    assert torch.equal(back["tensor"], torch.arange(4.0))


def test_state_a_checkpoint_cannot_hold_is_named_when_saved() -> None:
    with pytest.raises(TypeError, match=r"value\['lr'\] is a functools:partial"):
        Encoder({}).encode({"lr": functools.partial(max, 1)}, "value")


@pytest.mark.parametrize("name", ["os:system", "subprocess:Popen", "seedflood.sim.runner:run"])
def test_a_tree_naming_anything_but_a_seedflood_class_is_refused(name: str) -> None:
    node = {"t": "object", "n": 0, "class": name, "attributes": {}}
    with pytest.raises(PlainStateError):
        Decoder({}, []).decode(node)


class Hostile:
    """Unpickled, it would create ``marker``: what a crafted checkpoint does to torch.load with
    weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_crafted_checkpoint_runs_nothing_and_is_refused_by_name(
    writer: str, data_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    crafted = {"format": 2, "progress": Hostile(marker)}
    path = tmp_path / CHECKPOINT_NAME
    if writer == "torch.save":
        torch.save(crafted, path)
    else:
        path.write_bytes(pickle.dumps(crafted))
    with pytest.raises(CheckpointError, match="holds pickled objects") as refused:
        run(config(data_dir, "method=dsgd"), tmp_path, resume=True)
    assert not isinstance(refused.value, CheckpointDamaged)
    assert not marker.exists(), "loading the checkpoint ran the crafted command"
    assert path.is_file(), "a refused checkpoint is kept"


def flip_a_tensor_bit(path: Path) -> None:
    """Flip one bit in the middle of the checkpoint's largest tensor."""
    with zipfile.ZipFile(path) as archive:
        entries = [i for i in archive.infolist() if "/data/" in i.filename]
    largest = max(entries, key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", data, largest.header_offset + 26)
    start = largest.header_offset + 30 + name_length + extra_length
    data[start + largest.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["bit flip", "truncated"])
@pytest.mark.slow
def test_a_damaged_checkpoint_is_refused_before_it_touches_the_build(
    damage: str, data_dir: Path, tmp_path: Path
) -> None:
    """Gossip keeps no ledger: the damage is an error naming the file, and the run stops."""
    dsgd = config(data_dir, "method=dsgd")
    algorithm = build(dsgd).algorithm
    algorithm.run_round(0)
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, dsgd, PROGRESS, algorithm)
    if damage == "bit flip":
        flip_a_tensor_bit(path)
    else:
        os.truncate(path, path.stat().st_size * 2 // 3)
    fresh = build(dsgd).algorithm
    built = fresh.x.clone()
    with pytest.raises(CheckpointDamaged, match=f"{path} is damaged") as refused:
        load_checkpoint(path, dsgd, fresh)
    assert ("checksum" in str(refused.value)) == (damage == "bit flip")
    assert torch.equal(fresh.x, built) and not torch.equal(built, algorithm.x)
    with pytest.raises(CheckpointDamaged, match="delete it to resume"):
        run(dsgd, tmp_path, resume=True)


def test_a_checkpoints_round_is_read_without_reading_it_whole(tmp_path: Path) -> None:
    """What chooses between a checkpoint and a ledger: the round, or None for a file that says
    none (cut short, not sealed, or sealed without one)."""
    path = tmp_path / CHECKPOINT_NAME
    save_sealed(path, {"progress": {"round": 6}, "model": {"w": torch.zeros(4096)}})
    assert checkpoint_round(path) == 6
    os.truncate(path, path.stat().st_size // 2)
    assert checkpoint_round(path) is None
    for content in ({"progress": {"round": "6"}}, {"model": {}}):
        save_sealed(path, content)
        assert checkpoint_round(path) is None
    path.write_bytes(b"not a checkpoint")
    assert checkpoint_round(path) is None
    assert checkpoint_round(tmp_path / "absent.pt") is None


class Killed(Exception):
    """Raised where the run would die (in process, unlike SEEDFLOOD_FAULT_KILL_ROUND)."""


def die_at(requested: tuple[int, str] | None, done: int, point: str) -> None:
    if requested == (done, point):
        raise Killed


@pytest.mark.slow
def test_a_damaged_checkpoint_gives_way_to_the_ledger(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after round 5 with its checkpoint (of round 3) damaged and its ledger's round file
    lost (else the ledger, two rounds further, would be taken over the checkpoint unread): the
    run resumes from its ledger at round 3 and ends on the uninterrupted run's state hash,
    logging exactly its log."""
    seedflood = config(data_dir)
    whole = run(seedflood, tmp_path / "whole")
    cut = tmp_path / "cut"
    monkeypatch.setattr(runner, "maybe_kill", die_at)
    monkeypatch.setenv(KILL_ROUND_VARIABLE, "5")
    monkeypatch.setenv(KILL_AT_VARIABLE, "round")
    with pytest.raises(Killed):
        run(seedflood, cut, resume=True)
    monkeypatch.delenv(KILL_ROUND_VARIABLE)
    flip_a_tensor_bit(cut / CHECKPOINT_NAME)
    (cut / LAST_ROUND).unlink()

    notes: list[str] = []
    replays: list[tuple[int, int]] = []

    def watch(done: int, record: dict[str, Any]) -> None:
        notes.append(record.get("text", ""))
        if record["event"] == "replay":
            replays.append((done, record["total"]))

    resumed = run(seedflood, cut, watch, resume=True)
    assert any(
        "is damaged: checksum" in n and "resumed from the ledger at round 3" in n for n in notes
    )
    assert replays == [(1, 3), (2, 3), (3, 3)]
    assert resumed["state_hash"] == whole["state_hash"]
    timing = {"wall_seconds", "train_seconds", "peak_rss_mb", "peak_device_mb"}
    assert {k: v for k, v in json.loads(json.dumps(resumed)).items() if k not in timing} == {
        k: v for k, v in json.loads(json.dumps(whole)).items() if k not in timing
    }
    assert replay(cut)["state_hash"] == whole["state_hash"]


def test_with_checkpoints_off_evaluations_write_none_and_train_the_same_model(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a lent GPU's runs use: there a checkpoint cannot leave the machine, and writing one
    only costs time."""
    seedflood = config(data_dir)
    written: list[Path] = []

    def counted(path: Path, *rest: Any) -> None:
        written.append(path)
        save_checkpoint(path, *rest)

    monkeypatch.setattr(runner, "save_checkpoint", counted)
    with_checkpoints = run(seedflood, tmp_path / "on")
    assert len(written) == len(read_jsonl(tmp_path / "on" / "history.jsonl")) > 1
    written.clear()
    monkeypatch.setenv(CHECKPOINTS_VARIABLE, "off")
    without = run(seedflood, tmp_path / "off")
    assert written == [] and not (tmp_path / "off" / CHECKPOINT_NAME).exists()
    assert without["state_hash"] == with_checkpoints["state_hash"]


def test_a_checkpoints_setting_that_is_neither_on_nor_off_is_refused_before_any_work(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHECKPOINTS_VARIABLE, "sometimes")
    with pytest.raises(ConfigError, match=r"SEEDFLOOD_CHECKPOINTS='sometimes': use 'on' .* 'off'"):
        run(config(data_dir), tmp_path / "run")
    assert not (tmp_path / "run" / "history.jsonl").exists()
