"""Loss and accuracy from the candidates' log-likelihoods, shared by every method.

MeZO-style scoring: an example is a prompt and one continuation per class. The loss is the
cross-entropy over the candidates' mean token log-likelihoods and the prediction is their argmax.
When every candidate is a single token (SST-2's " terrible"/" great", Yes/No tasks) this is the
cross-entropy over the label words' logits at the answer position, and only that position goes
through the output head: the full-vocabulary head over every position would cost about a fifth of
SmolLM2's forward.

A language-modelling example has one candidate, its completion: a cross-entropy over one class is
always zero, so its loss is the completion's mean negative log-likelihood instead, and it counts
as correct when greedy decoding would write the completion exactly (every completion token is the
argmax after the tokens before it, which is what greedy decoding of that many tokens produces).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from seedflood.learning.precision import autocast
from seedflood.learning.tasks import Example


@dataclass(frozen=True, slots=True)
class TokenizedExample:
    prompt: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]
    label: int


def tokenize(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], max_length: int
) -> list[TokenizedExample]:
    """Prompt and candidates tokenized apart (as MeZO does); long prompts lose their beginning,
    which keeps the question and the answer position."""
    cache: dict[str, tuple[int, ...]] = {}

    def candidate_ids(text: str) -> tuple[int, ...]:
        if text not in cache:
            cache[text] = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        return cache[text]

    tokenized = []
    for example in examples:
        candidates = tuple(candidate_ids(c) for c in example.candidates)
        budget = max_length - max(len(c) for c in candidates)
        prompt = tuple(tokenizer(example.prompt)["input_ids"])[-budget:]
        tokenized.append(TokenizedExample(prompt, candidates, example.label))
    return tokenized


def _is_single_token(batch: Sequence[TokenizedExample]) -> bool:
    """Classes that are one token each, the same for every example: the cheap path."""
    first = batch[0].candidates
    return (
        len(first) > 1
        and all(len(c) == 1 for c in first)
        and all(e.candidates == first for e in batch)
    )


def rows_per_example(batch: Sequence[TokenizedExample]) -> list[int]:
    """How many model input rows ``candidate_scores`` gives each example: one on the
    single-token path, one per candidate otherwise."""
    if _is_single_token(batch):
        return [1] * len(batch)
    return [len(e.candidates) for e in batch]


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor``, built on the CPU, on ``device`` without waiting for a GPU: a copy from pageable
    memory first drains the GPU's queue, so a forward's inputs copied that way stop the CPU from
    queueing work ahead of it; a copy from pinned memory is queued like a kernel."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def pad(
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right padding (to the longest, or to ``width``): real tokens keep positions 0..len-1
    under a causal mask. Filled on the CPU and moved to ``device`` once, not row by row."""
    width = width or max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device="cpu")
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long, device="cpu")
        mask[row, : len(seq)] = 1
    return to_device(ids, device), to_device(mask, device)


def candidate_scores(
    model: nn.Module, batch: Sequence[TokenizedExample], pad_id: int
) -> torch.Tensor:
    """Scores (batch × candidates): mean log-likelihood of each candidate's tokens, up to a
    per-example constant (single-token candidates skip the log-softmax, which cancels in the
    cross-entropy and the argmax)."""
    return _scores_and_matches(model, batch, pad_id)[0]


def _scores_and_matches(
    model: nn.Module, batch: Sequence[TokenizedExample], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scores, and on the general path whether each candidate is every token's argmax.

    The forward runs in the run's precision (seedflood.learning.precision); the scores leave it
    in fp32, so losses and gradients are taken at full precision from lower-precision logits."""
    backbone = model.base_model
    head = model.get_output_embeddings()
    device = head.weight.device
    in_precision = autocast(device.type)
    if _is_single_token(batch):
        ids, mask = pad([e.prompt for e in batch], pad_id, device)
        return single_token_scores(model, ids, mask, label_ids(batch, device)), None
    sequences, spans = [], []
    for example in batch:
        for candidate in example.candidates:
            start = len(example.prompt)
            sequences.append(example.prompt + candidate)
            spans.append((start, len(candidate)))
    ids, mask = pad(sequences, pad_id, device)
    scores = torch.empty(len(sequences), dtype=torch.float32)
    matches = torch.empty(len(sequences), dtype=torch.bool)
    with in_precision:
        hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        for row, (start, length) in enumerate(spans):
            targets = ids[row, start : start + length]
            logits = head(hidden[row, start - 1 : start - 1 + length]).float()
            log_probs = F.log_softmax(logits, dim=-1)
            scores[row] = log_probs.gather(1, targets[:, None]).mean()
            matches[row] = bool((log_probs.argmax(dim=-1) == targets).all())
    return scores.view(len(batch), -1), matches.view(len(batch), -1)


def label_ids(batch: Sequence[TokenizedExample], device: torch.device) -> torch.Tensor:
    """The token of each class, on ``device``: a batch on the single-token path shares them."""
    return to_device(torch.tensor([c[0] for c in batch[0].candidates], device="cpu"), device)


def single_token_scores(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Scores (rows × classes) on the single-token path, from right-padded ``ids`` and ``mask``
    and the classes' tokens ``labels``: each row's last real position through the output head's
    rows for those tokens alone. Only tensor operations, none that waits for a GPU, so that
    seedflood.algorithms.graphs can record it as a CUDA graph."""
    backbone = model.base_model
    head = model.get_output_embeddings()
    with autocast(ids.device.type):
        hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        last = hidden[torch.arange(len(ids), device=ids.device), mask.sum(dim=1) - 1]
        logits = last @ head.weight[labels].T
    return logits.float()


def example_losses(
    scores: torch.Tensor, labels: torch.Tensor, reduction: str = "none"
) -> torch.Tensor:
    """Each example's loss (or their mean): the cross-entropy over its candidates, or (one
    candidate, language modelling) the candidate's negative mean log-likelihood."""
    if scores.shape[1] > 1:
        return F.cross_entropy(scores, labels, reduction=reduction)
    losses = -scores[:, 0]
    return losses.mean() if reduction == "mean" else losses


def batch_loss(model: nn.Module, batch: Sequence[TokenizedExample], pad_id: int) -> torch.Tensor:
    """The differentiable mean cross-entropy that first-order methods backpropagate through."""
    labels = torch.tensor([e.label for e in batch])
    return example_losses(candidate_scores(model, batch, pad_id), labels, reduction="mean")


def _batch_stats(
    model: nn.Module, batch: Sequence[TokenizedExample], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Scores (float64), labels and the number of correct predictions (language modelling:
    exact greedy completions)."""
    with torch.inference_mode():
        scores, matches = _scores_and_matches(model, batch, pad_id)
    scores = scores.double()
    labels = torch.tensor([e.label for e in batch])
    if scores.shape[1] == 1:
        assert matches is not None  # one candidate never takes the single-token path
        return scores, labels, int(matches.sum())
    return scores, labels, int((scores.argmax(dim=1) == labels).sum())


def loss_and_correct(
    model: nn.Module, batch: Sequence[TokenizedExample], pad_id: int
) -> tuple[float, int]:
    """Mean loss over the batch and the number of correct predictions."""
    scores, labels, correct = _batch_stats(model, batch, pad_id)
    return example_losses(scores, labels, reduction="mean").item(), correct


def majority_rate(examples: Sequence[TokenizedExample]) -> float:
    """Accuracy of always answering the most common label: a model must beat this, not only
    its untrained self, before it can be said to have learned the task (an untrained model can
    sit below it, and training can reach it by learning nothing but the label balance)."""
    if not examples:
        raise ValueError("cannot take the majority label of an empty example set")
    return max(Counter(e.label for e in examples).values()) / len(examples)


@dataclass(frozen=True)
class Evaluation:
    accuracy: float  # language modelling: the share of exact greedy completions
    loss: float  # mean over examples
    perplexity: float | None  # language modelling: exp(mean negative log-likelihood per token)


def evaluation(
    model: nn.Module, examples: Sequence[TokenizedExample], pad_id: int, batch_size: int = 32
) -> Evaluation:
    """Accuracy and loss over ``examples``, batched by length so padding stays small."""
    if not examples:
        raise ValueError("cannot evaluate on an empty example set")
    ordered = sorted(examples, key=lambda e: len(e.prompt))
    correct, loss_sum, token_nll, tokens = 0, 0.0, 0.0, 0
    for start in range(0, len(ordered), batch_size):
        batch = ordered[start : start + batch_size]
        scores, labels, batch_correct = _batch_stats(model, batch, pad_id)
        losses = example_losses(scores, labels)
        correct += batch_correct
        loss_sum += float(losses.sum())
        lengths = [len(e.candidates[0]) for e in batch]
        token_nll += float((losses * torch.tensor(lengths, dtype=losses.dtype)).sum())
        tokens += sum(lengths)
    language_model = len(ordered[0].candidates) == 1
    return Evaluation(
        correct / len(examples),
        loss_sum / len(examples),
        math.exp(token_nll / tokens) if language_model else None,
    )


def accuracy(
    model: nn.Module, examples: Sequence[TokenizedExample], pad_id: int, batch_size: int = 32
) -> float:
    """Accuracy over ``examples``, batched by length so padding stays small."""
    if not examples:
        raise ValueError("cannot measure accuracy on an empty example set")
    return evaluation(model, examples, pad_id, batch_size).accuracy
