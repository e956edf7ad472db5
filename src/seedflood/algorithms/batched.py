"""Many clients' perturbed models in one batched forward over the shared base weights.

Under SubCGE a client's model differs from the shared base by a few updates, each adding
f · V_e[:, κ] to row ρ of every weight matrix W (m × n_in). For an input row x of that client,

    x (W + Σ f e_ρ V_e[:, κ]ᵀ)ᵀ = x Wᵀ + Σ f (x V_e)[κ] e_ρ,

one shared matrix product, one projection x V_e (r values per token: a few percent of the
product), and per update one of those values added to one output column. A forward hook on every
trained linear layer adds those terms, so the model code is untouched and the rows of all
clients, sorted by length to keep padding small, go through the model together. Results equal
the per-client computation up to floating-point rounding.

Gossip clients under LoRA (DZSGD-LoRA) share the base weights too and differ only in their small
adapter matrices, so there each input row goes through its own client's adapter weights (one
batched matrix product per adapter layer) and everything else is shared in the same way.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from seedflood.algorithms.graphs import ForwardGraphs
from seedflood.learning.scoring import (
    TokenizedExample,
    candidate_scores,
    example_losses,
    rows_per_example,
    to_device,
)
from seedflood.zo import SubCGEDirection, Update


@dataclass
class Segment:
    """One client model (the base plus ``updates``) and the examples to score with it."""

    examples: Sequence[TokenizedExample]
    updates: Sequence[Update]


@dataclass
class _EpochPairs:
    """The (input row, update) pairs of one subspace epoch in the current forward, on the model's
    device: each pair's input row, and per matrix and pair the output column it adds to (the
    update's row), the basis column it reads and its factor."""

    epoch: int
    rows: torch.Tensor
    targets: torch.Tensor
    cols: torch.Tensor
    factors: torch.Tensor


class _Terms:
    """Every segment's updates as (row, column, factor) per matrix, and for the rows of the current
    forward the (input row, update) pairs that apply.

    The pairs are found on the CPU and moved to the model's device once per forward, so the 7 ×
    layers hooks of a forward only queue GPU work: an index, an epoch or a count read back from
    the GPU inside a hook would wait for every kernel queued before it, hook after hook."""

    def __init__(self, direction: SubCGEDirection, segments: Sequence[Segment]) -> None:
        self.direction = direction
        self.device = direction.matrices[0].device
        flat = sorted(
            (s, seed, step, coef)
            for s, segment in enumerate(segments)
            for seed, step, coef in segment.updates
        )
        cpu = torch.device("cpu")
        self.counts = torch.tensor([len(s.updates) for s in segments], dtype=torch.long, device=cpu)
        self.starts = torch.cumsum(self.counts, 0) - self.counts
        coords = [direction.coordinates(seed) for _, seed, _, _ in flat]
        self.epochs = torch.tensor([direction.epoch(step) for _, _, step, _ in flat], device=cpu)
        coefs = torch.tensor([coef for *_, coef in flat], dtype=torch.float64, device=cpu)
        scales = torch.tensor(direction.scales, dtype=torch.float64, device=cpu)[:, None]
        self.rows = torch.stack([c[0] for c in coords], dim=1) if flat else None
        self.cols = torch.stack([c[1] for c in coords], dim=1) if flat else None
        signs = torch.stack([c[2] for c in coords], dim=1) if flat else None
        self.factors = (coefs * signs * scales).float() if flat else None
        self.pairs: list[_EpochPairs] = []
        self.one_each = False
        self.tokens: torch.Tensor | None = None
        self.position = {w.data_ptr(): index for index, w in enumerate(direction.matrices)}

    def linear_index(self, module: nn.Linear) -> int | None:
        return self.position.get(module.weight.data_ptr())

    def select_rows(self, row_segments: torch.Tensor) -> None:
        """Pair every input row of the next forward (``row_segments``, on the CPU) with its
        segment's updates, grouped by epoch, and move the pairs to the model's device."""
        self.pairs, self.one_each = [], False
        if self.rows is None or self.cols is None or self.factors is None:
            return
        per_row = self.counts[row_segments]
        pair_rows = torch.arange(len(row_segments), device="cpu").repeat_interleave(per_row)
        offsets = torch.cumsum(per_row, 0) - per_row
        within = torch.arange(int(per_row.sum()), device="cpu") - offsets.repeat_interleave(per_row)
        pair_terms = self.starts[row_segments].repeat_interleave(per_row) + within
        epochs = self.epochs[pair_terms]
        matrices = len(self.rows)
        self.one_each = bool((per_row == 1).all()) and len(epochs.unique()) == 1
        for epoch in epochs.unique().tolist():
            mask = epochs == epoch
            picked = pair_terms[mask]
            indices = torch.cat([pair_rows[mask][None], self.rows[:, picked], self.cols[:, picked]])
            moved = to_device(indices, self.device)
            self.pairs.append(
                _EpochPairs(
                    epoch=epoch,
                    rows=moved[0],
                    targets=moved[1 : 1 + matrices],
                    cols=moved[1 + matrices :],
                    factors=to_device(self.factors[:, picked], self.device),
                )
            )

    def graph_inputs(self) -> tuple[Hashable, dict[str, torch.Tensor]] | None:
        """The pairs of the next forward as tensors a CUDA graph can be fed, with what a graph
        recorded over them must share (the epoch: its basis is read where it lies); None where
        the pairs are not one per row, whose count varies from forward to forward."""
        if not self.one_each:
            return None
        (pairs,) = self.pairs
        tensors = {"targets": pairs.targets, "cols": pairs.cols, "factors": pairs.factors}
        return pairs.epoch, tensors

    def use_graph_inputs(self, epoch: Hashable, tensors: dict[str, torch.Tensor]) -> None:
        """Read the next forward's pairs (one per row, in row order) from ``tensors``."""
        rows = torch.arange(len(tensors["factors"][0]), device=self.device)
        assert isinstance(epoch, int)
        self.pairs, self.one_each = [_EpochPairs(epoch, rows, **tensors)], True

    def alter(self, index: int, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """``output`` plus the terms of the rows' updates. Under a lower forward precision the
        terms stand for the perturbation and the clients' differences, which stay in fp32 (see
        seedflood.learning.precision): they are computed outside autocast and the output they
        are added to is widened, not the terms rounded."""
        if not self.pairs:
            return output
        x, output = x.float(), output.float()
        autocasting = torch.is_autocast_enabled(x.device.type)
        with torch.autocast(x.device.type, enabled=False) if autocasting else nullcontext():
            if self.one_each:
                return self._alter_one_each(index, x, output)
            if self.tokens is None or self.tokens.shape[1] != x.shape[1]:
                self.tokens = torch.arange(x.shape[1], device=x.device)[None, :]
            for pairs in self.pairs:
                projected = x @ self.direction.basis(pairs.epoch)[index].T
                values = projected[pairs.rows, :, pairs.cols[index]] * pairs.factors[index][:, None]
                output.index_put_(
                    (pairs.rows[:, None], self.tokens, pairs.targets[index][:, None]),
                    values,
                    accumulate=True,
                )
        return output

    def _alter_one_each(self, index: int, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """`alter` where every input row has exactly one update (a round whose clients all hold
        the same messages: only the ± perturbation differs): a gather and a scatter along the
        last dimension, the same products and sums as the general path's advanced indexing,
        which on a GPU costs a bounds check per index tensor and a sort besides."""
        (pairs,) = self.pairs
        shape = (len(pairs.rows), x.shape[1], 1)
        projected = x @ self.direction.basis(pairs.epoch)[index].T
        values = projected.gather(2, pairs.cols[index].view(-1, 1, 1).expand(shape))
        values = values * pairs.factors[index].view(-1, 1, 1)
        return output.scatter_add_(2, pairs.targets[index].view(-1, 1, 1).expand(shape), values)


class _RowTerms(Protocol):
    """What one batched forward changes in the shared linear layers' outputs, row by row."""

    def linear_index(self, module: nn.Linear) -> int | None: ...

    def select_rows(self, row_segments: torch.Tensor) -> None: ...

    def alter(self, index: int, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor: ...


class _RowWeights:
    """Every segment's own weights for the bias-free linear layers whose weights are ``params``
    (LoRA's A and B matrices): each input row is multiplied by its segment's copy, so whatever
    the shared model holds there is ignored."""

    def __init__(self, params: Sequence[nn.Parameter], weights: torch.Tensor) -> None:
        self.position: dict[int, int] = {}
        self.slices: list[tuple[int, torch.Size]] = []
        offset = 0
        for index, param in enumerate(params):
            self.position[id(param)] = index
            self.slices.append((offset, param.shape))
            offset += param.numel()
        if offset != weights.shape[1]:
            raise ValueError(f"weights have {weights.shape[1]} columns, the parameters {offset}")
        self.weights = weights
        self.row_segments = torch.zeros(0, dtype=torch.long)

    def linear_index(self, module: nn.Linear) -> int | None:
        index = self.position.get(id(module.weight))
        if index is not None and module.bias is not None:
            raise ValueError("per-row weights need bias-free linear layers (LoRA's are)")
        return index

    def select_rows(self, row_segments: torch.Tensor) -> None:
        self.row_segments = to_device(row_segments, self.weights.device)

    def alter(self, index: int, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        offset, shape = self.slices[index]
        rows = self.weights[self.row_segments, offset : offset + shape.numel()]
        return torch.bmm(x, rows.view(-1, *shape).transpose(1, 2))


@contextmanager
def _hooks(model: nn.Module, terms: _RowTerms) -> Iterator[None]:
    handles = []
    for module in model.modules():
        index = terms.linear_index(module) if isinstance(module, nn.Linear) else None
        if index is None:
            continue

        def hook(
            _module: nn.Module, inputs: tuple, output: torch.Tensor, index: int = index
        ) -> torch.Tensor:
            return terms.alter(index, inputs[0], output)

        handles.append(module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Unaltered:
    """No row altered: the forwards of the shared model itself."""

    def linear_index(self, module: nn.Linear) -> int | None:
        return None

    def select_rows(self, row_segments: torch.Tensor) -> None:
        return None

    def alter(self, index: int, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        return output

    def graph_inputs(self) -> tuple[Hashable, dict[str, torch.Tensor]]:
        return None, {}

    def use_graph_inputs(self, epoch: Hashable, tensors: dict[str, torch.Tensor]) -> None:
        return None


def _row_lengths(example: TokenizedExample) -> list[int]:
    """Lengths of the rows ``candidate_scores`` gives an example: one prompt row when its classes
    are single tokens, else a prompt + candidate row per candidate (a completion's one row)."""
    lengths = [len(c) for c in example.candidates]
    if len(lengths) > 1 and max(lengths) == 1:
        return [len(example.prompt)]
    return [len(example.prompt) + length for length in lengths]


def _padded_shape(example: TokenizedExample) -> tuple[int, int]:
    """Rows and padded length ``candidate_scores`` gives an example."""
    lengths = _row_lengths(example)
    return len(lengths), max(lengths)


FORWARD_TOKENS = 2048
"""Padded tokens per batched forward (`_padded_chunks`) on a CPU, where a forward's cost is its
arithmetic: small chunks of similar lengths pad little (1.5× at 16 clients on SST-2)."""

GPU_FORWARD_TOKENS = 16384
"""Padded tokens per batched forward on a GPU, where a small forward's cost is launching its
kernels, hooks included: on an H100 the 256 sequences of a 16-client round took 0.19 s as three
chunks of 2,048 tokens and 0.11 s as one padded batch (fp32, docs/performance.md)."""


def forward_tokens(device: torch.device) -> int:
    """Padded tokens per batched forward on ``device``."""
    return GPU_FORWARD_TOKENS if device.type == "cuda" else FORWARD_TOKENS


def _padded_chunks(
    owned: Sequence[tuple[int, TokenizedExample]], tokens_per_forward: int
) -> Iterator[Sequence[tuple[int, TokenizedExample]]]:
    """Consecutive runs of length-sorted examples whose padded inputs hold at most
    ``tokens_per_forward`` tokens. A budget in tokens, not rows: one long sentence in a chunk of
    fixed row count pads every row to its length, and on SST-2 that wasted half the compute."""
    start, rows, width = 0, 0, 0
    for end, (_, example) in enumerate(owned):
        added, longest = _padded_shape(example)
        if end > start and (rows + added) * max(width, longest) > tokens_per_forward:
            yield owned[start:end]
            start, rows, width = end, 0, 0
        rows, width = rows + added, max(width, longest)
    if owned:
        yield owned[start:]


def _owned(batches: Sequence[Sequence[TokenizedExample]]) -> list[tuple[int, TokenizedExample]]:
    """Every batch's examples with their batch's index, sorted by length."""
    return sorted(
        ((s, example) for s, batch in enumerate(batches) for example in batch),
        key=lambda item: len(item[1].prompt),
    )


def padding(
    batches: Sequence[Sequence[TokenizedExample]], tokens_per_forward: int = FORWARD_TOKENS
) -> tuple[int, int]:
    """Real and padded tokens of the forwards that batched losses of ``batches`` run."""
    real = padded = 0
    for chunk in _padded_chunks(_owned(batches), tokens_per_forward):
        rows = [_row_lengths(example) for _, example in chunk]
        real += sum(sum(lengths) for lengths in rows)
        padded += sum(len(lengths) for lengths in rows) * max(max(lengths) for lengths in rows)
    return real, padded


def _batched_losses(
    model: nn.Module,
    terms: _RowTerms,
    batches: Sequence[Sequence[TokenizedExample]],
    pad_id: int,
    tokens_per_forward: int,
    graphs: ForwardGraphs | None = None,
) -> list[float]:
    """Mean cross-entropy of every segment's examples, segment s's rows altered by ``terms``;
    on the single-token path through ``graphs`` where given."""
    owned = _owned(batches)
    losses, owners = [], []
    with torch.inference_mode(), _hooks(model, terms):
        for chunk in _padded_chunks(owned, tokens_per_forward):
            examples = [example for _, example in chunk]
            example_segments = torch.tensor([s for s, _ in chunk], device="cpu")
            per_example = rows_per_example(examples)
            scores = None
            if (
                graphs is not None
                and graphs.wanted()
                and isinstance(terms, _Terms | _Unaltered)
                and max(per_example) == 1
            ):
                scores = graphs.scores(model, terms, examples, example_segments, pad_id)
            if scores is None:
                rows = torch.tensor(per_example, device="cpu")
                terms.select_rows(example_segments.repeat_interleave(rows))
                scores = candidate_scores(model, examples, pad_id)
            scores = scores.double()
            labels = torch.tensor([e.label for e in examples], device="cpu")
            labels = to_device(labels, scores.device)
            losses.append(example_losses(scores, labels))
            owners.append(example_segments)
    # Read back once, after the last forward, and summed on the CPU in the examples' order: sums
    # of one order on every device, and no wait for the GPU between forwards.
    per_example = torch.cat(losses).cpu()
    segments = torch.cat(owners)
    totals = torch.zeros(len(batches), dtype=torch.float64, device="cpu")
    counts = torch.zeros(len(batches), dtype=torch.float64, device="cpu")
    totals.index_add_(0, segments, per_example)
    counts.index_add_(0, segments, torch.ones_like(per_example))
    return (totals / counts).tolist()


def segment_losses(
    model: nn.Module,
    direction: SubCGEDirection,
    segments: Sequence[Segment],
    pad_id: int,
    tokens_per_forward: int = FORWARD_TOKENS,
    graphs: ForwardGraphs | None = None,
) -> list[float]:
    """Mean cross-entropy of every segment's examples under its own model, batched (and replayed
    from CUDA graphs through ``graphs`` where given: seedflood.algorithms.graphs)."""
    terms = _Terms(direction, segments)
    batches = [segment.examples for segment in segments]
    return _batched_losses(model, terms, batches, pad_id, tokens_per_forward, graphs)


def shared_losses(
    model: nn.Module,
    batches: Sequence[Sequence[TokenizedExample]],
    pad_id: int,
    tokens_per_forward: int = FORWARD_TOKENS,
    graphs: ForwardGraphs | None = None,
) -> list[float]:
    """Mean cross-entropy of every batch under the shared model itself, in the forwards batched
    losses of the same batches run (the same chunks, padded alike): the plain-forward reference
    that benchmarks/gpu.py times a batched step against, eager or (``graphs``) replayed."""
    return _batched_losses(model, _Unaltered(), batches, pad_id, tokens_per_forward, graphs)


def row_weight_losses(
    model: nn.Module,
    params: Sequence[nn.Parameter],
    weights: torch.Tensor,
    batches: Sequence[Sequence[TokenizedExample]],
    pad_id: int,
    tokens_per_forward: int = FORWARD_TOKENS,
) -> list[float]:
    """Mean cross-entropy of ``batches[s]`` under the model whose ``params`` (weights of bias-free
    linear layers) hold ``weights[s]``, the flattened parameters in order, for every s, batched."""
    terms = _RowWeights(params, weights)
    return _batched_losses(model, terms, batches, pad_id, tokens_per_forward)
