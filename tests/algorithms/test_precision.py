"""Forwards in a lower precision (the run config's ``dtype``): clients stay bit-identical, the
scalars move by a measured amount, the forwards really compute in bf16, and the weights, the
perturbation and message application stay in fp32."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from seedflood.algorithms.batched import Segment, segment_losses
from seedflood.build import run_precision
from seedflood.config import ConfigError, load_config
from seedflood.learning.accuracy_cache import accuracy_key
from seedflood.learning.models import load_model
from seedflood.learning.precision import forward_precision
from seedflood.learning.scoring import candidate_scores, evaluation, tokenize
from seedflood.learning.tasks import Example
from seedflood.protocol.messages import quantize
from seedflood.sim.runner import run
from seedflood.topology import make_topology
from tests.algorithms.test_seedflood import (
    PerClientCopies,
    make_seedflood,
    parameters,
    same,
    synthetic_examples,
)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


@pytest.mark.slow
def test_bf16_clients_compute_alike_and_end_bit_identical(tiny, one_thread) -> None:
    """Each per-client copy runs its own bf16 forwards on its own model; the shared-state
    simulator must hold every one of those models bit for bit, in flight and once flooded."""
    topology = make_topology("ring", 4)
    hashes = {}
    for dtype in ("fp32", "bf16"):
        sim = make_seedflood(tiny, topology, hops=1)
        reference = PerClientCopies(sim, copy.deepcopy(sim.model))
        with forward_precision(dtype):
            for round_index in range(3):
                sim.run_round(round_index)
                reference.run_round(round_index)
                for client in range(sim.n):
                    with sim.client_view(client):
                        assert same(parameters(sim.model), parameters(reference.model_of(client)))
        assert sim.consensus_distance() > 0
        for round_index in range(3, 3 + topology.diameter):
            sim.replay_round(round_index, [])  # flood what is in flight; no new messages
        assert sim.clients_identical() and sim.consensus_distance() == 0.0
        everything = {key: m for held in reference.held for key, m in held.items()}
        for client in range(sim.n):
            reference.held[client] = dict(everything)
            assert same(parameters(reference.model_of(client)), parameters(sim.model))
        hashes[dtype] = sim.state_hash()
        assert all(p.dtype == torch.float32 for p in sim.model.parameters())
    assert hashes["bf16"] != hashes["fp32"]


def relative_error(estimates: torch.Tensor, exact: torch.Tensor) -> float:
    return float((estimates - exact).norm() / exact.norm())


def test_bf16_scalars_differ_from_fp32_by_a_bounded_relative_error(tiny, one_thread) -> None:
    """On the fp32 trajectory, every client's scalar recomputed with bf16 forwards (the same
    models, seeds and batches). Measured on this tiny model over these 32 messages: relative
    error ‖s_bf16 − s_fp32‖ / ‖s_fp32‖ = 0.129 (median per message 0.29), every sign the same;
    fp16, with 3 more mantissa bits, 0.015."""
    sim = make_seedflood(tiny, make_topology("ring", 4), hops=2)
    scalars: dict[str, list[float]] = {"fp32": [], "bf16": [], "fp16": []}
    for round_index in range(8):
        for dtype in ("bf16", "fp16"):
            with forward_precision(dtype):
                scalars[dtype] += [s for s, _ in sim.estimates(round_index)]
        scalars["fp32"] += [s for s, _ in sim.estimates(round_index)]
        sim.run_round(round_index)
    # estimating has no side effect: the round flooded exactly the fp32 scalars above
    committed = [m.scalar for m in sim.take_committed()]
    assert committed == [quantize(s, "fp32") for s in scalars["fp32"]]
    exact, bf16, fp16 = (torch.tensor(scalars[k], dtype=torch.float64) for k in scalars)
    assert 0.03 < relative_error(bf16, exact) < 0.3
    assert float((bf16.sign() == exact.sign()).double().mean()) >= 0.8
    assert relative_error(fp16, exact) < relative_error(bf16, exact) / 4


def test_bf16_forwards_compute_in_bf16_and_the_weights_stay_fp32(tiny, one_thread) -> None:
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    pad = tokenizer.pad_token_id
    batch = tokenize(tokenizer, synthetic_examples(6), 64)
    before = parameters(model)
    exact = candidate_scores(model, batch, pad)
    with forward_precision("bf16"), torch.inference_mode():
        low = candidate_scores(model, batch, pad)
    # the label logits come out of a bf16 product: every value is a bf16 number
    assert low.dtype == torch.float32 and torch.equal(low, low.bfloat16().float())
    assert not torch.equal(exact, exact.bfloat16().float())
    assert 0 < float((low - exact).abs().max()) < 0.05
    # the general path (a completion scored token by token) too
    completions = tokenize(tokenizer, [Example("Say hi:", (" hello there",), 0)] * 2, 32)
    with forward_precision("bf16"):
        low_nll = evaluation(model, completions, pad).loss
    assert low_nll != evaluation(model, completions, pad).loss
    assert low_nll == pytest.approx(evaluation(model, completions, pad).loss, rel=0.02)
    # batched forwards: the ±ε perturbation rides in fp32 corrections, so bf16 still sees it
    sim = make_seedflood(tiny, make_topology("ring", 2), hops=1, batched=True)
    segments = [Segment(batch, [(123, 0, sign * 1e-3)]) for sign in (1.0, -1.0)]
    exact_losses = segment_losses(sim.model, sim.direction, segments, pad)
    with forward_precision("bf16"):
        plus, minus = segment_losses(sim.model, sim.direction, segments, pad)
    assert plus != minus and [plus, minus] != exact_losses
    assert [plus, minus] == pytest.approx(exact_losses, rel=0.02)
    assert same(parameters(model), before)


def test_a_precision_torch_cannot_compute_is_refused_by_name(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="fp16 gradients underflow without loss scaling"):
        load_config(None, ["method=dsgd", "dtype=fp16"])
    with pytest.raises(ConfigError, match="key 'dtype'"):
        load_config(None, ["dtype=fp8"])
    monkeypatch.setattr("seedflood.build.autocasts", lambda name, device: name == "fp32")
    with pytest.raises(ConfigError, match=r"cannot compute fp16 forwards on cpu; use dtype fp32$"):
        run_precision(load_config(None, ["dtype=fp16"]), torch.device("cpu"))


def test_scores_are_cached_per_precision(tiny) -> None:
    model, tokenizer = tiny
    examples = tokenize(tokenizer, synthetic_examples(2), 64)
    fp32 = accuracy_key(model, examples, tokenizer.pad_token_id, 4)
    with forward_precision("bf16"):
        assert accuracy_key(model, examples, tokenizer.pad_token_id, 4) != fp32
    assert accuracy_key(model, examples, tokenizer.pad_token_id, 4) == fp32


def test_a_run_trains_in_its_configs_precision(data_dir: Path, tmp_path: Path, one_thread) -> None:
    keys = ["model=tiny", f"data_dir={data_dir}", "clients=2", "rounds=1", "batch_size=4"]
    keys += ["n_train=8", "n_val=4", "n_test=4", "rank=8", "save_model=false"]
    losses = {}
    for dtype in ("fp32", "bf16"):
        results = run(load_config(None, [*keys, f"dtype={dtype}"]), tmp_path / dtype)
        assert results["config"]["dtype"] == dtype
        losses[dtype] = results["eval_loss"]
    assert losses["bf16"] != losses["fp32"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)
