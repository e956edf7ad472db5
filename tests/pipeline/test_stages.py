"""Pipeline stages against the unsplit model: same loss, same training, exact crash recovery."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from seedflood.learning.models import converted_model_dir, load_model
from seedflood.pipeline.calibration import llama_from_smollm2, measure_stage_seconds
from seedflood.pipeline.stages import (
    IGNORE_INDEX,
    PipelineTrainer,
    Stage,
    StageInputs,
    StageWorker,
    split_llama,
)

SEQ_LEN = 8
REAL_TOKENS = 6
Microbatch = dict[str, Tensor]
Trained = tuple[PipelineTrainer, list[float], PreTrainedModel, list[float]]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny() -> PreTrainedModel:
    return load_model("tiny", seed=0)[0]


@pytest.fixture(scope="module")
def four_layers() -> PreTrainedModel:
    """A 4-layer Llama with a small vocabulary, so three stages exist and steps are cheap."""
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return LlamaForCausalLM(config).eval().requires_grad_(False)


def _microbatch(vocab: int, seed: int) -> Microbatch:
    """Two rows, one right- and one left-padded, so every microbatch has the same 11 targets.

    Equal target counts make the mean of microbatch losses equal the full batch's token mean,
    which is what lets pipelined SGD be compared with full-batch SGD exactly.
    """
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (2, SEQ_LEN), generator=generator)
    attention_mask = torch.zeros(2, SEQ_LEN, dtype=torch.long)
    attention_mask[0, :REAL_TOKENS] = 1
    attention_mask[1, SEQ_LEN - REAL_TOKENS :] = 1
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _microbatches(model: PreTrainedModel, count: int, seed: int) -> list[Microbatch]:
    return [_microbatch(model.config.vocab_size, seed * 100 + i) for i in range(count)]


def _concatenated(microbatches: list[Microbatch]) -> Microbatch:
    return {key: torch.cat([mb[key] for mb in microbatches]) for key in microbatches[0]}


def _chain_loss(stages: list[Stage], microbatch: Microbatch) -> Tensor:
    activations = microbatch["input_ids"]
    for stage in stages:
        activations = stage(activations, microbatch["attention_mask"], microbatch["labels"])
    return activations


def _unsplit_name(stage: Stage, name: str) -> str:
    if name.startswith("layers."):
        _, position, rest = name.split(".", 2)
        return f"model.layers.{stage.layer_indices[int(position)]}.{rest}"
    return name if name == "lm_head.weight" else f"model.{name}"


@pytest.mark.parametrize("stage_count", [1, 2])
def test_split_tiny_reproduces_the_unsplit_loss(tiny: PreTrainedModel, stage_count: int) -> None:
    stages = split_llama(tiny, stage_count)
    batch = _concatenated(_microbatches(tiny, 2, seed=0))
    with torch.no_grad():
        expected = tiny(**batch).loss
        got = _chain_loss(stages, batch)
    torch.testing.assert_close(got, expected)
    assert [list(stage.layer_indices) for stage in stages] == (
        [[0, 1]] if stage_count == 1 else [[0], [1]]
    )


def test_three_stages_put_the_extra_layer_first(four_layers: PreTrainedModel) -> None:
    stages = split_llama(four_layers, 3)
    assert [list(stage.layer_indices) for stage in stages] == [[0, 1], [2], [3]]
    assert stages[0].embed_tokens is not None and stages[-1].lm_head is not None
    batch = _concatenated(_microbatches(four_layers, 2, seed=1))
    with torch.no_grad():
        torch.testing.assert_close(_chain_loss(stages, batch), four_layers(**batch).loss)


@pytest.mark.parametrize("stage_count", [0, 3])
def test_split_rejects_impossible_stage_counts(tiny: PreTrainedModel, stage_count: int) -> None:
    with pytest.raises(ValueError, match="between 1 and the number of decoder layers"):
        split_llama(tiny, stage_count)


def _full_batch_sgd(model: PreTrainedModel, batches: list[Microbatch], lr: float) -> list[float]:
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        gradients = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for parameter, gradient in zip(model.parameters(), gradients, strict=True):
                parameter.sub_(gradient, alpha=lr)
        losses.append(loss.item())
    return losses


PATHS = [
    [[0, 0], [0, 1], [1, 0], [1, 1]],
    [[1, 1], [1, 1], [0, 0], [1, 0]],
    [[0, 1], [0, 1], [0, 1], [0, 1]],  # replica 1 of stage 0 and 0 of stage 1 sit idle
]


@pytest.fixture(scope="module")
def trained_both(tiny: PreTrainedModel) -> Trained:
    """Three SGD steps of the 2-stage, 2-replica pipeline and of the unsplit model."""
    lr = 1.0
    iterations = [_microbatches(tiny, 4, seed=10)] * len(PATHS)
    trainer = PipelineTrainer(split_llama(tiny, 2), replicas_per_stage=2)
    pipelined = [
        trainer.train_iteration(mbs, paths, lr)
        for mbs, paths in zip(iterations, PATHS, strict=True)
    ]
    reference = copy.deepcopy(tiny).requires_grad_(True)
    plain = _full_batch_sgd(reference, [_concatenated(mbs) for mbs in iterations], lr)
    return trainer, pipelined, reference, plain


def test_pipelined_sgd_equals_full_batch_sgd(trained_both: Trained, tiny: PreTrainedModel) -> None:
    trainer, pipelined, reference, plain = trained_both
    assert pipelined == pytest.approx(plain, rel=1e-5)
    assert plain[-1] < plain[0]
    unsplit = reference.state_dict()
    moved = unsplit["lm_head.weight"] - tiny.state_dict()["lm_head.weight"]
    assert moved.abs().max() > 1e-3  # far above the tolerance, so equality is not vacuous
    for workers in trainer.replicas:
        stage = workers[0].stage
        for name, parameter in stage.state_dict().items():
            torch.testing.assert_close(
                parameter, unsplit[_unsplit_name(stage, name)], rtol=1e-5, atol=1e-6
            )


def test_replicas_of_a_stage_stay_bit_identical(trained_both: Trained) -> None:
    trainer = trained_both[0]
    for workers in trainer.replicas:
        first = workers[0].stage.state_dict()
        for worker in workers[1:]:
            for name, parameter in worker.stage.state_dict().items():
                assert torch.equal(parameter, first[name]), name
    embedding = trainer.replicas[0][0].stage.embed_tokens.weight
    assert torch.equal(embedding, trainer.replicas[-1][0].stage.lm_head.weight)


def _grads(worker: StageWorker) -> list[Tensor]:
    return [parameter.grad for parameter in worker.stage.parameters()]


def test_stateless_backward_matches_stateful_with_one_more_forward(
    four_layers: PreTrainedModel,
) -> None:
    stages = split_llama(four_layers, 3)
    stateful = [StageWorker(copy.deepcopy(stage)) for stage in stages]
    stateless = [StageWorker(copy.deepcopy(stage)) for stage in stages]
    microbatch = _microbatch(four_layers.config.vocab_size, seed=5)

    def inputs(activations: Tensor) -> StageInputs:
        return StageInputs(activations, microbatch["attention_mask"], microbatch["labels"])

    sent = [inputs(microbatch["input_ids"])]
    for kept, passing in zip(stateful, stateless, strict=True):
        output = kept.forward(0, sent[-1])
        torch.testing.assert_close(passing.forward_stateless(sent[-1]), output, rtol=0, atol=0)
        sent.append(inputs(output))
    grad_stateful = grad_stateless = None
    for index in reversed(range(len(stages))):
        grad_stateful = stateful[index].backward(0, grad_stateful)
        grad_stateless = stateless[index].backward_stateless(sent[index], grad_stateless)
        if index:
            torch.testing.assert_close(grad_stateless, grad_stateful, rtol=0, atol=0)
    assert grad_stateful is None and grad_stateless is None
    for ours, theirs in zip(stateful, stateless, strict=True):
        for a, b in zip(_grads(ours), _grads(theirs), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert (ours.forward_count, ours.backward_count) == (1, 1)
        assert (theirs.forward_count, theirs.backward_count) == (2, 1)


CRASH_PATHS = [[0, 0, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0]]


@pytest.mark.parametrize(
    ("microbatch", "stage", "replacement", "recomputed"),
    [
        (1, 1, 0, [1]),  # the crashed relay served only this microbatch
        (0, 1, 1, [0, 2, 3]),  # later microbatches whose forward died with it are redone too
        (1, 0, 0, [1, 3]),  # the data holder re-sends the tokens
        (1, 2, 0, [1, 2]),  # the last stage recomputes the loss, no gradient to re-send
    ],
)
def test_backward_crash_recomputes_only_the_crashed_stage(
    four_layers: PreTrainedModel,
    microbatch: int,
    stage: int,
    replacement: int,
    recomputed: list[int],
) -> None:
    stages = split_llama(four_layers, 3)
    microbatches = _microbatches(four_layers, 4, seed=7)
    calm = PipelineTrainer(stages, replicas_per_stage=2)
    crashed = PipelineTrainer(stages, replicas_per_stage=2)
    calm_loss = calm.train_iteration(microbatches, CRASH_PATHS, lr=0.5)
    crash_loss = crashed.train_iteration(
        microbatches, CRASH_PATHS, lr=0.5, backward_crashes={microbatch: (stage, replacement)}
    )
    assert crash_loss == calm_loss
    dead = CRASH_PATHS[microbatch][stage]
    assert not crashed.replicas[stage][dead].alive
    for index in range(len(stages)):
        for replica, (ours, theirs) in enumerate(
            zip(calm.replicas[index], crashed.replicas[index], strict=True)
        ):
            extra = len(recomputed) if (index, replica) == (stage, replacement) else 0
            if (index, replica) == (stage, dead):
                continue
            assert theirs.forward_count == ours.forward_count + extra
            assert theirs.backward_count == ours.backward_count + extra
            for a, b in zip(ours.stage.parameters(), theirs.stage.parameters(), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    total_backwards = sum(w.backward_count for workers in crashed.replicas for w in workers)
    assert total_backwards == len(microbatches) * len(stages)


def test_work_lost_with_a_crashed_relay_leaves_the_stage_average(
    four_layers: PreTrainedModel,
) -> None:
    """Replica 1 of the last stage dies after finishing microbatch 1 and while serving 2.

    Its gradient for microbatch 1 is gone, so the last stage must step with the mean gradient
    of the other three microbatches, not count the lost one as zero.
    """
    microbatches = _microbatches(four_layers, 4, seed=7)
    crashed = PipelineTrainer(split_llama(four_layers, 3), replicas_per_stage=2)
    crashed.train_iteration(microbatches, CRASH_PATHS, lr=0.5, backward_crashes={2: (2, 0)})
    reference = copy.deepcopy(four_layers).requires_grad_(True)
    survivors = [microbatches[i] for i in (0, 2, 3)]
    _full_batch_sgd(reference, [_concatenated(survivors)], lr=0.5)
    unsplit = reference.state_dict()
    last = crashed.replicas[2][0].stage
    for name, parameter in last.state_dict().items():
        if name != "lm_head.weight":  # tied to the embedding, which also mixes stage 0's work
            torch.testing.assert_close(parameter, unsplit[_unsplit_name(last, name)])


def test_paths_must_name_live_replicas(four_layers: PreTrainedModel) -> None:
    trainer = PipelineTrainer(split_llama(four_layers, 3), replicas_per_stage=[1, 2, 1])
    microbatches = _microbatches(four_layers, 1, seed=4)
    with pytest.raises(ValueError, match="stage 0 has no replica 1"):
        trainer.begin_iteration(microbatches, [[1, 0, 0]])
    trainer.crash(1, 1)
    with pytest.raises(ValueError, match="crashed replica 1"):
        trainer.begin_iteration(microbatches, [[0, 1, 0]])


def test_recover_stage_needs_the_successors_gradient(four_layers: PreTrainedModel) -> None:
    trainer = PipelineTrainer(split_llama(four_layers, 3), replicas_per_stage=2)
    trainer.begin_iteration(_microbatches(four_layers, 1, seed=3), [[0, 0, 0]])
    trainer.forward_microbatch(0)
    trainer.crash(1, 0)
    with pytest.raises(ValueError, match="not been backpropagated"):
        trainer.recover_stage(1, 0, replacement=1)


def test_measure_stage_seconds_times_a_forward(tiny: PreTrainedModel) -> None:
    first, last = split_llama(tiny, 2)
    for stage in (first, last):
        seconds = measure_stage_seconds(stage, micro_batch=2, seq_len=16, repeats=3)
        assert 0 < seconds < 5 and math.isfinite(seconds)
    with pytest.raises(ValueError, match=">= 1"):
        measure_stage_seconds(first, micro_batch=2, seq_len=16, repeats=0)


def test_llama_from_smollm2_has_smollm2_shape_without_downloads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cached = (converted_model_dir() / "config.json").is_file()
    from_cache = llama_from_smollm2(layers=1, seed=0) if cached else None
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path))
    published = llama_from_smollm2(layers=1, seed=0)
    attention = 2 * 576 * 576 + 2 * 576 * 192  # q and o full width, k and v for 3 of 9 heads
    layer = attention + 3 * 576 * 1536 + 2 * 576
    assert sum(p.numel() for p in published.parameters()) == 49152 * 576 + layer + 576
    assert published.lm_head.weight is published.model.embed_tokens.weight
    assert published.config.rope_parameters["rope_theta"] == 100000.0
    if from_cache is not None:
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
        ):
            assert getattr(from_cache.config, key) == getattr(published.config, key)
        assert torch.equal(from_cache.lm_head.weight, published.lm_head.weight)
