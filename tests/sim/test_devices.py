"""The device a simulation computes on: chosen by $SEEDFLOOD_DEVICE, checked up front, and never
a source of randomness (the draws that define a run are made on the CPU on every device).

This machine has no GPU, so the draws are checked under a default device of ``meta``: a draw that
followed the default device would fail there or differ from the CPU's."""

from __future__ import annotations

import copy

import pytest
import torch

from seedflood.algorithms.common import sample_batch
from seedflood.config import ConfigError
from seedflood.learning.models import add_lora, load_model
from seedflood.sim.devices import DEVICE_VARIABLE, available_bytes, peak_device_mb, run_device
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
        ("gpu", r"SEEDFLOOD_DEVICE='gpu' is not a device; use 'cpu', 'cuda' or 'cuda:N'"),
        ("mps", r"SEEDFLOOD_DEVICE='mps': simulations run on 'cpu', 'cuda' or 'cuda:N'"),
    ],
)
def test_a_name_that_is_no_device_says_what_is(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, value)
    with pytest.raises(ConfigError, match=message):
        run_device()


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
    """Every random draw a run makes from its seeds: batches, both directions, LoRA adapters."""
    picks = torch.tensor(sample_batch(list(range(50)), 3, 7, 8, run_seed=5), device="cpu")
    subcge = SubCGEDirection(trainable_matrices(model), rank=4, refresh=10, run_seed=5)
    coordinates = list(subcge.coordinates(1234))
    basis = subcge.basis(0)
    dense = DenseDirection(list(model.parameters())[:3]).touch(99, 0).values
    adapters = add_lora(copy.deepcopy(model), rank=2, alpha=4, targets=("q_proj",), seed=5)
    return [picks, *coordinates, *basis, *dense, *(a.detach() for a in adapters)]


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
