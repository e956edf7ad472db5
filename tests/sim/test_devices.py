"""The device a simulation computes on: chosen by $SEEDFLOOD_DEVICE (a peer's by --device, through
the same checks), checked up front, and never a source of randomness (the draws that define a run
are made on the CPU on every device).

Without a GPU the draws are checked under a default device of ``meta``: a draw that followed the
default device would fail there or differ from the CPU's. Where torch sees a GPU, the draws are
also materialised there and compared bit for bit."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack

from seedflood.algorithms.common import sample_batch
from seedflood.build import compute_device, on_device
from seedflood.config import ConfigError, load_config
from seedflood.learning.models import add_lora, load_model, state_hash
from seedflood.peers.node import Node, PeerOptions
from seedflood.sim.devices import (
    DEVICE_VARIABLE,
    DRAW_THREADS_VARIABLE,
    available_bytes,
    draw_threads,
    peak_device_mb,
    run_device,
)
from seedflood.zo import DenseDirection, SubCGEDirection, trainable_matrices


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


@pytest.mark.parametrize("value", [None, "", "  ", "cpu"])
def test_the_cpu_unless_a_device_is_named(monkeypatch: pytest.MonkeyPatch, value) -> None:
    if value is None:
        monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEVICE_VARIABLE, value)
    assert run_device() == torch.device("cpu")
    assert peak_device_mb(run_device()) is None
    assert available_bytes(run_device()) > 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu", r"SEEDFLOOD_DEVICE='gpu' is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ("mps", r"SEEDFLOOD_DEVICE='mps': seedflood computes on 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ],
)
def test_a_name_that_is_no_device_says_what_is(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, value)
    with pytest.raises(ConfigError, match=message):
        run_device()


@pytest.mark.parametrize(
    ("value", "cores", "threads"),
    [(None, 2, 2), (None, 1, 1), (None, 16, 8), (None, 64, 8), ("0", 2, 0), (" 12 ", 2, 12)],
)
def test_draw_threads_are_one_a_core_at_most_8_unless_set(
    monkeypatch: pytest.MonkeyPatch, value: str | None, cores: int, threads: int
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    if value is None:
        monkeypatch.delenv(DRAW_THREADS_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DRAW_THREADS_VARIABLE, value)
    assert draw_threads() == threads


@pytest.mark.parametrize("value", ["-1", "two", "1.5", "65"])
def test_draw_threads_that_are_no_count_say_what_is(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(DRAW_THREADS_VARIABLE, value)
    with pytest.raises(
        ConfigError, match=rf"SEEDFLOOD_DRAW_THREADS='{value}': give a whole number"
    ):
        draw_threads()


@pytest.mark.parametrize("gpu", [False, True])
def test_auto_is_a_gpu_where_torch_sees_one(monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    chosen = compute_device("auto", setting="--device", on_cpu="use --device cpu")
    assert chosen == torch.device("cuda" if gpu else "cpu")


def test_a_peer_checks_its_device_as_the_simulator_does(tmp_path: Path) -> None:
    """`seedflood peer --device` goes through the simulator's checks, before any loading."""
    options = PeerOptions(run_id="r", state_dir=tmp_path, out_dir=tmp_path, device="cpu")
    assert Node(load_config(None), options, say=print).device == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"^--device='mps': seedflood computes on 'auto'"):
        Node(load_config(None), replace(options, device="mps"), say=print)


def test_cuda_without_a_gpu_says_how_to_run_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="sees no CUDA GPU; unset SEEDFLOOD_DEVICE"):
        run_device()


def test_cuda_index_past_the_last_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"only cuda:0 to cuda:1 exist"):
        run_device()


def _draws(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every random draw a run makes from its seeds: batches, both directions (and a SubCGE
    direction's values as a message adds them), LoRA adapters."""
    picks = torch.tensor(sample_batch(list(range(50)), 3, 7, 8, run_seed=5), device="cpu")
    subcge = SubCGEDirection(trainable_matrices(model), rank=4, refresh=10, run_seed=5)
    coordinates = list(subcge.coordinates(1234))
    basis = subcge.basis(0)
    dense = DenseDirection(list(model.parameters())[:3]).touch(99, 0).values
    subcge_values = subcge.touch(1234, 3).values
    adapters = add_lora(copy.deepcopy(model), rank=2, alpha=4, targets=("q_proj",), seed=5)
    return [
        picks,
        *coordinates,
        *basis,
        *dense,
        *subcge_values,
        *(a.detach() for a in adapters),
    ]


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: checks that draws made on the CPU materialise on it bit for bit",
)
def test_directions_materialised_on_a_gpu_are_the_cpus_bit_for_bit(tiny) -> None:
    """Directions are drawn on the CPU by design and only moved to the GPU: the same seed must
    give the same values there, so a run's messages mean one model on every device."""
    expected = _draws(tiny[0])
    gpu_model = copy.deepcopy(tiny[0]).to("cuda")
    with torch.device("cuda"):
        drawn = _draws(gpu_model)
    assert len(drawn) == len(expected)
    assert any(got.device.type == "cuda" for got in drawn)
    for got, want in zip(drawn, expected, strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: checks that a GPU applies messages as the CPU does, bit for bit",
)
def test_a_gpu_applies_many_messages_as_the_cpu_does(tiny) -> None:
    """A commit of more than 16 messages, several on one row: CUDA's index_add_ would race over
    such rows, so they are added in order (zo.add_rows_in_order) and round as on the CPU."""
    updates = [(seed, 0, 0.01 * (seed % 7 - 3)) for seed in range(64)]
    hashes = []
    for device in ("cpu", "cuda", "cuda"):
        model = copy.deepcopy(tiny[0]).to(device)
        direction = SubCGEDirection(trainable_matrices(model), rank=4, refresh=10, run_seed=5)
        with torch.device(device):
            direction.apply(updates)
        hashes.append(state_hash(direction.tensors))
    rows = torch.stack([direction.coordinates(seed)[0].cpu() for seed, _, _ in updates], dim=1)
    assert all(len(set(r.tolist())) < len(updates) for r in rows)  # rows repeat in every matrix
    assert hashes[0] != state_hash(trainable_matrices(tiny[0]))
    assert hashes == [hashes[0]] * 3


def test_random_draws_do_not_follow_the_default_device(tiny) -> None:
    model = tiny[0]
    expected = _draws(model)
    with torch.device("meta"):
        drawn = _draws(model)
    assert len(drawn) == len(expected)
    for got, want in zip(drawn, expected, strict=True):
        assert got.device.type == "cpu"
        assert torch.equal(got, want)


def test_models_load_on_the_cpu_whatever_the_default_device() -> None:
    expected, _ = load_model("tiny", seed=3)
    with torch.device("meta"):
        loaded, _ = load_model("tiny", seed=3)
    for got, want in zip(loaded.parameters(), expected.parameters(), strict=True):
        assert got.device.type == "cpu"
        assert torch.equal(got, want)


def test_on_the_default_device_no_torch_function_mode_slows_every_call() -> None:
    # a torch.device context routes every call through a Python handler; on the device that is
    # the default already it would change nothing else, so none is entered
    with on_device(torch.device("cpu")):
        assert _get_current_function_mode_stack() == []
        assert torch.zeros(1).device.type == "cpu"
    with on_device(torch.device("meta")):  # another device is still where tensors land
        assert torch.zeros(1).device.type == "meta"
    with torch.device("meta"), on_device(torch.device("cpu")):  # so is the CPU, when not default
        assert torch.zeros(1).device.type == "cpu"
