"""Batched forwards replayed as CUDA graphs.

On a GPU a round's forward is bound by launching kernels, not by their arithmetic: 16 clients
forward 256 short sentences through 30 layers, about 3,400 kernels with the correction hooks, and
on an H100 the GPU sat idle for most of the round while the CPU queued them (docs/performance.md).
A CUDA graph records a forward's kernels once and launches them together. It records addresses,
not values: each forward's inputs and the hooks' (row, update) pairs are copied into tensors the
graph owns before it is replayed, and the weights are read where they lie, so the walks, restores
and commits that change them in place are seen by every replay.

Only forwards in a lower precision (bf16, fp16) are replayed: in fp32 a GPU's forwards are
bound by arithmetic, and a replay gained nothing (see `ForwardGraphs.wanted`). A graph fixes its
shapes. So a forward's rows are padded to a multiple of `ROW_STEP` (copies of
its last row, whose scores are dropped) and its width to a multiple of `WIDTH_STEP` (pad tokens
the mask hides), and a shape is recorded the second time it is seen, never for a shape seen
once: recording costs about three forwards. The same rows, padded differently, may round their
last bits differently from the eager forward; replays of one graph are deterministic.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from seedflood.learning.precision import forward_dtype
from seedflood.learning.scoring import TokenizedExample, label_ids, pad, single_token_scores

ROW_STEP = 64
WIDTH_STEP = 16
GRAPHS_KEPT = 8
"""Graphs kept at once, the least recently replayed dropped first: each holds the memory of one
forward's activations (about 1.5 GB for 16,384 tokens of SmolLM2-135M)."""
WARMUP = 2  # eager forwards on a side stream before recording, as torch.cuda.graphs asks

log = logging.getLogger(__name__)

Forward = Callable[[], torch.Tensor]
Replay = Callable[[Forward], torch.Tensor]
Record = Callable[[Forward], Replay]
"""Records a forward and returns what replays it. A replay is handed the forward it stands for:
`cuda_graph`'s ignores it; the tests' eager recorder runs it, over the graph's own tensors."""


def cuda_graph(forward: Forward) -> Replay:
    """``forward`` recorded as a CUDA graph, after warm-up forwards on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = forward()

    def replay(_: Forward) -> torch.Tensor:
        graph.replay()
        return output

    return replay


def forward_graphs(device: torch.device) -> ForwardGraphs | None:
    """Graphs for the batched forwards of a model on ``device``: on a GPU, where launches bound
    them; none elsewhere, where a forward's cost is its arithmetic."""
    return ForwardGraphs() if device.type == "cuda" else None


class GraphTerms(Protocol):
    """What the hooks of a recorded forward read, as tensors a graph can own."""

    def select_rows(self, row_segments: torch.Tensor) -> None: ...

    def graph_inputs(self) -> tuple[Hashable, dict[str, torch.Tensor]] | None: ...

    def use_graph_inputs(self, key: Hashable, tensors: dict[str, torch.Tensor]) -> None: ...


@dataclass
class _Graph:
    inputs: dict[str, torch.Tensor]
    replay: Replay


class ForwardGraphs:
    """The graphs of one model's batched single-token forwards, by shape."""

    def __init__(self, record: Record = cuda_graph, kept: int = GRAPHS_KEPT) -> None:
        self.record = record
        self.kept = kept
        self.graphs: OrderedDict[Hashable, _Graph] = OrderedDict()
        self.seen: set[Hashable] = set()
        self.recorded = self.replayed = 0
        self.failure: str | None = None

    def scores(
        self,
        model: nn.Module,
        terms: GraphTerms,
        examples: Sequence[TokenizedExample],
        segments: torch.Tensor,
        pad_id: int,
    ) -> torch.Tensor | None:
        """`candidate_scores` of single-token ``examples``, example i's row altered by
        ``terms`` as segment ``segments[i]``, replayed from a graph; None where no graph fits
        (several updates a row), for the caller's eager forward, unpadded."""
        extra = -len(examples) % ROW_STEP
        terms.select_rows(torch.cat([segments, segments[-1:].expand(extra)]))
        pairs = terms.graph_inputs()
        if pairs is None:
            return None
        prompts = [e.prompt for e in examples] + [examples[-1].prompt] * extra
        width = -(-max(len(p) for p in prompts) // WIDTH_STEP) * WIDTH_STEP
        device = model.get_output_embeddings().weight.device
        ids, mask = pad(prompts, pad_id, device, width)
        labels = label_ids(examples, device)
        epoch, tensors = pairs
        inputs = {"ids": ids, "mask": mask, "labels": labels, **tensors}
        key = (epoch, *((name, tuple(t.shape), t.dtype) for name, t in inputs.items()))

        def forward(given: dict[str, torch.Tensor]) -> torch.Tensor:
            terms.use_graph_inputs(epoch, {name: given[name] for name in tensors})
            return single_token_scores(model, given["ids"], given["mask"], given["labels"])

        return self._run(key, inputs, forward)[: len(examples)]

    @staticmethod
    def wanted() -> bool:
        """Whether the next forwards should go through graphs: in a lower forward precision. In
        fp32 an H200's forwards were bound by arithmetic, not launches, and replays were slower
        than eager forwards (docs/performance.md): those stay eager, unpadded."""
        return forward_dtype() != "fp32"

    def _run(
        self,
        key: Hashable,
        inputs: dict[str, torch.Tensor],
        forward: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    ) -> torch.Tensor:
        graph = self.graphs.get(key)
        if graph is not None:
            for name, tensor in inputs.items():
                graph.inputs[name].copy_(tensor)
            self.graphs.move_to_end(key)
            self.replayed += 1
            # a copy: the graph's output is overwritten by its next replay
            return graph.replay(lambda: forward(graph.inputs)).clone()
        if self.failure is not None or key not in self.seen:
            self.seen.add(key)
            return forward(inputs)
        owned = {name: tensor.clone() for name, tensor in inputs.items()}
        try:
            replay = self.record(lambda: forward(owned))
        except RuntimeError as error:  # what torch cannot record here: forwards stay eager
            self.failure = f"{type(error).__name__}: {error}"
            log.warning("batched forwards run eagerly: recording a CUDA graph failed (%s)", error)
            return forward(inputs)
        self.graphs[key] = _Graph(owned, replay)
        self.recorded += 1
        while len(self.graphs) > self.kept:
            self.graphs.popitem(last=False)
        self.replayed += 1
        return replay(lambda: forward(owned)).clone()
