"""Real pipeline stages of a Llama model, the replicas that serve them, and their training.

GWTF and SWARM are compared in simulation, which must rest on what a stage really costs and on
recovery that really yields the same model. So a causal LM is split into contiguous stages, each
served by replicas ("relays") that are stateful (GWTF: keep activations, never recompute) or
stateless (SWARM: re-run the forward inside the backward); replicas of a stage average their
gradients, and a crash mid-backward is recovered by recomputing only the crashed stage from the
tensors its neighbours kept (GWTF's crash recovery, as in the authors' 2024 prototype).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.masking_utils import create_causal_mask

IGNORE_INDEX = -100


class Stage(nn.Module):
    """A contiguous slice of a Llama model that owns deep copies of its parameters.

    Every stage rebuilds the rotary embeddings and the causal/padding mask from the attention
    mask that travels with the microbatch, so only hidden states cross stage boundaries, exactly
    what a relay would receive over the network.
    """

    def __init__(
        self,
        config: LlamaConfig,
        layer_indices: range,
        layers: Sequence[nn.Module],
        rotary: nn.Module,
        embed_tokens: nn.Embedding | None,
        head: tuple[nn.Module, nn.Linear] | None,
    ) -> None:
        super().__init__()
        self.config = config
        self.layer_indices = layer_indices
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.rotary = rotary
        self.norm, self.lm_head = head if head is not None else (None, None)

    def forward(
        self, activations: Tensor, attention_mask: Tensor, labels: Tensor | None = None
    ) -> Tensor:
        """Map token ids (first stage) or hidden states to hidden states, or to the loss (last).

        Positions are 0..seq_len-1 for every row, as in the unsplit LlamaModel, so left padding
        behaves identically; the mask keeps padding out of attention and out of the loss.
        """
        hidden = self.embed_tokens(activations) if self.embed_tokens is not None else activations
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(self.config, hidden, attention_mask, None, positions)
        rope = self.rotary(hidden, position_ids=positions)
        for layer in self.layers:
            hidden = layer(
                hidden, attention_mask=mask, position_embeddings=rope, position_ids=positions
            )
        if self.lm_head is None:
            return hidden
        if labels is None:
            raise ValueError("the last stage computes the loss and needs the microbatch's labels")
        logits = self.lm_head(self.norm(hidden))
        return causal_lm_loss(logits, labels, attention_mask)


def causal_lm_loss(logits: Tensor, labels: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean next-token cross entropy over real tokens, the quantity the unsplit model reports.

    Padding is dropped from the targets even when the caller passed labels=input_ids, so a
    microbatch never trains on predicting pad tokens.
    """
    targets = labels.masked_fill(attention_mask == 0, IGNORE_INDEX)[:, 1:].flatten()
    predictions = logits[:, :-1].flatten(0, 1).float()
    return F.cross_entropy(predictions, targets, ignore_index=IGNORE_INDEX)


def split_llama(model: PreTrainedModel, stages: int) -> list[Stage]:
    """Split a Llama-style causal LM into `stages` contiguous stages balanced by layer count.

    Every stage holds at least one decoder layer (1 <= stages <= layers), so no relay serves a
    bare embedding lookup. Leftover layers go to the earlier stages because the last one already
    carries the vocabulary projection, the costliest matrix of a small model. Stages train all
    their parameters; a tied embedding and head on different stages become two copies that
    PipelineTrainer keeps equal by summing their gradients.
    """
    body = model.model
    layers = list(body.layers)
    if not 1 <= stages <= len(layers):
        raise ValueError(
            f"stages must be between 1 and the number of decoder layers ({len(layers)}) so "
            f"that every stage holds at least one layer; got {stages}"
        )
    base, extra = divmod(len(layers), stages)
    result: list[Stage] = []
    start = 0
    for index in range(stages):
        indices = range(start, start + base + (index < extra))
        start = indices.stop
        memo: dict[int, object] = {}  # one memo per stage keeps a single-stage tie intact
        stage = Stage(
            config=copy.deepcopy(model.config, memo),
            layer_indices=indices,
            layers=[copy.deepcopy(layers[i], memo) for i in indices],
            rotary=copy.deepcopy(body.rotary_emb, memo),
            embed_tokens=copy.deepcopy(body.embed_tokens, memo) if index == 0 else None,
            head=copy.deepcopy((body.norm, model.lm_head), memo) if index == stages - 1 else None,
        )
        result.append(stage.requires_grad_(True))
    return result


@dataclass(frozen=True)
class StageInputs:
    """What a relay receives: token ids (first stage) or hidden states, plus the metadata that
    rides along because every stage needs the mask and the last one needs the labels."""

    activations: Tensor
    attention_mask: Tensor
    labels: Tensor | None = None


class StageWorker:
    """One replica of one stage, with the bookkeeping GWTF's recovery relies on.

    A stateful forward keeps the received input and the autograd graph so the backward needs no
    recompute, and the worker keeps what it sent each way (output downstream, gradient upstream)
    until the iteration ends, so a crashed neighbour can be recovered from them. Parameter
    gradients accumulate as the sum over handled microbatches; the counters let the simulator's
    useful-versus-recomputed accounting be checked against real executions.
    """

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.forward_count = 0
        self.backward_count = 0
        self.microbatches_in_gradient = 0
        self.alive = True
        self._graphs: dict[int, tuple[Tensor, Tensor]] = {}
        self._sent_outputs: dict[int, Tensor] = {}
        self._sent_gradients: dict[int, Tensor | None] = {}

    def forward(self, microbatch_id: int, inputs: StageInputs) -> Tensor:
        self._require_alive()
        if microbatch_id in self._graphs:
            raise ValueError(f"microbatch {microbatch_id} is already in flight on this replica")
        received, output = self._run_forward(inputs)
        self._graphs[microbatch_id] = (received, output)
        self._sent_outputs[microbatch_id] = output.detach()
        return self._sent_outputs[microbatch_id]

    def backward(self, microbatch_id: int, grad_output: Tensor | None) -> Tensor | None:
        """Backpropagate a kept forward; grad_output is None for the last stage's loss."""
        self._require_alive()
        if microbatch_id not in self._graphs:
            raise ValueError(f"microbatch {microbatch_id} has no kept forward on this replica")
        received, output = self._graphs.pop(microbatch_id)
        grad_input = self._run_backward(received, output, grad_output)
        self._sent_gradients[microbatch_id] = grad_input
        return grad_input

    def forward_stateless(self, inputs: StageInputs) -> Tensor:
        """SWARM's forward keeps nothing, which is what lets any replica serve the backward."""
        self._require_alive()
        with torch.no_grad():
            output = self.stage(inputs.activations, inputs.attention_mask, inputs.labels)
        self.forward_count += 1
        return output

    def backward_stateless(self, inputs: StageInputs, grad_output: Tensor | None) -> Tensor | None:
        """SWARM's backward: any replica can serve it, at the price of re-running the forward."""
        self._require_alive()
        received, output = self._run_forward(inputs)
        return self._run_backward(received, output, grad_output)

    def sent_output(self, microbatch_id: int) -> Tensor:
        return self._sent_outputs[microbatch_id]

    def sent_gradient(self, microbatch_id: int) -> Tensor | None:
        if microbatch_id not in self._sent_gradients:
            raise ValueError(f"microbatch {microbatch_id} has not been backpropagated here yet")
        return self._sent_gradients[microbatch_id]

    def crash(self) -> None:
        """Lose everything a dead relay held: kept tensors and the gradients not yet averaged."""
        self.alive = False
        self.release_iteration()

    def release_iteration(self) -> None:
        self._graphs.clear()
        self._sent_outputs.clear()
        self._sent_gradients.clear()
        self.stage.zero_grad(set_to_none=True)
        self.microbatches_in_gradient = 0

    def _require_alive(self) -> None:
        if not self.alive:
            raise RuntimeError("this replica has crashed; route the microbatch elsewhere")

    def _run_forward(self, inputs: StageInputs) -> tuple[Tensor, Tensor]:
        received = inputs.activations
        if received.is_floating_point():
            received = received.detach().requires_grad_(True)
        with torch.enable_grad():
            output = self.stage(received, inputs.attention_mask, inputs.labels)
        self.forward_count += 1
        return received, output

    def _run_backward(
        self, received: Tensor, output: Tensor, grad_output: Tensor | None
    ) -> Tensor | None:
        output.backward(grad_output)
        self.backward_count += 1
        self.microbatches_in_gradient += 1
        return received.grad if received.requires_grad else None


class PipelineTrainer:
    """Pipelined SGD over replicated stages, equal to full-batch SGD on the unsplit model.

    `replicas[stage][index]` serves stage `stage`; a path gives the replica index per stage for
    one microbatch. An iteration is `begin_iteration`, `forward_microbatch` and
    `backward_microbatch` for each microbatch, then `step`; `train_iteration` does all of it.
    A relay that crashes mid-backward is handled with `crash` and `recover_stage`.
    """

    def __init__(self, stages: Sequence[Stage], replicas_per_stage: int | Sequence[int]) -> None:
        counts = (
            [replicas_per_stage] * len(stages)
            if isinstance(replicas_per_stage, int)
            else list(replicas_per_stage)
        )
        if len(counts) != len(stages) or min(counts, default=0) < 1:
            raise ValueError("replicas_per_stage needs one count >= 1 per stage")
        self.replicas = [
            [StageWorker(copy.deepcopy(stage)) for _ in range(count)]
            for stage, count in zip(stages, counts, strict=True)
        ]
        self._microbatches: list[Mapping[str, Tensor]] = []
        self._paths: list[list[int]] = []
        self._losses: dict[int, Tensor] = {}

    def begin_iteration(
        self, microbatches: Sequence[Mapping[str, Tensor]], paths: Sequence[Sequence[int]]
    ) -> None:
        if len(microbatches) != len(paths) or not microbatches:
            raise ValueError("give one path per microbatch and at least one microbatch")
        for path in paths:
            if len(path) != len(self.replicas):
                raise ValueError(f"path {list(path)} must name one replica per stage")
            for stage, index in enumerate(path):
                if index not in range(len(self.replicas[stage])):
                    raise ValueError(f"path {list(path)}: stage {stage} has no replica {index}")
                if not self.replicas[stage][index].alive:
                    raise ValueError(f"path {list(path)} routes through crashed replica {index}")
        self._microbatches = list(microbatches)
        self._paths = [list(path) for path in paths]
        self._losses = {}

    def forward_microbatch(self, microbatch_id: int) -> Tensor:
        for stage in range(len(self.replicas)):
            self._worker(stage, microbatch_id).forward(
                microbatch_id, self._inputs_of(stage, microbatch_id)
            )
        loss = self._worker(len(self.replicas) - 1, microbatch_id).sent_output(microbatch_id)
        self._losses[microbatch_id] = loss
        return loss

    def backward_stage(self, stage: int, microbatch_id: int) -> None:
        """Backpropagate one stage of one microbatch with the gradient its successor sent."""
        self._worker(stage, microbatch_id).backward(
            microbatch_id, self._grad_output_of(stage, microbatch_id)
        )

    def backward_microbatch(self, microbatch_id: int) -> None:
        for stage in reversed(range(len(self.replicas))):
            self.backward_stage(stage, microbatch_id)

    def crash(self, stage: int, replica: int) -> None:
        self.replicas[stage][replica].crash()

    def recover_stage(self, stage: int, microbatch_id: int, replacement: int) -> None:
        """Redo one stage of one microbatch on another replica after its relay crashed.

        The predecessor re-sends the activation it kept (the data holder re-sends the tokens)
        and the successor re-sends the gradient it already computed, so the replacement runs
        exactly one forward and one backward of this stage and nothing else is recomputed. The
        path is updated, so `backward_stage` on the earlier stages continues upstream as usual.
        """
        worker = self.replicas[stage][replacement]
        if not worker.alive:
            raise ValueError(f"replacement replica {replacement} of stage {stage} has crashed")
        self._paths[microbatch_id][stage] = replacement
        worker.forward(microbatch_id, self._inputs_of(stage, microbatch_id))
        worker.backward(microbatch_id, self._grad_output_of(stage, microbatch_id))

    def step(self, lr: float) -> float:
        """Average each stage's gradient over its live replicas and apply one SGD step to all.

        Each replica's gradient is a sum over the microbatches it handled, so summing replicas
        and dividing by the microbatches counted is the replica average weighted by work done;
        a crashed replica's unaveraged work is lost, as in GWTF where a stage does not wait for
        a dead relay. Every live replica applies the very same tensor, so they stay identical.
        """
        averaged = [self._average_gradients(stage) for stage in range(len(self.replicas))]
        self._sum_tied_embedding_gradients(averaged)
        with torch.no_grad():
            for stage, gradients in enumerate(averaged):
                for worker in self._live(stage):
                    for parameter, gradient in zip(
                        worker.stage.parameters(), gradients, strict=True
                    ):
                        parameter.sub_(gradient, alpha=lr)
        for stage in range(len(self.replicas)):
            for worker in self._live(stage):
                worker.release_iteration()
        return torch.stack(list(self._losses.values())).mean().item()

    def train_iteration(
        self,
        microbatches: Sequence[Mapping[str, Tensor]],
        paths: Sequence[Sequence[int]],
        lr: float,
        backward_crashes: Mapping[int, tuple[int, int]] | None = None,
    ) -> float:
        """Run every forward, then every backward, then one step; return the mean loss.

        `backward_crashes[m] = (stage, replacement)` crashes the relay serving `stage` for
        microbatch m when m's gradient reaches it; m, and every later microbatch whose forward
        graph died with that relay, is recovered on replica `replacement` of the same stage.
        """
        self.begin_iteration(microbatches, paths)
        for microbatch_id in range(len(microbatches)):
            self.forward_microbatch(microbatch_id)
        crashes = backward_crashes or {}
        replacement_of: dict[int, int] = {}
        for microbatch_id in range(len(microbatches)):
            crashed_stage, replacement = crashes.get(microbatch_id, (None, None))
            for stage in reversed(range(len(self.replicas))):
                if stage == crashed_stage:
                    self.crash(stage, self._paths[microbatch_id][stage])
                    replacement_of[stage] = replacement
                if self._worker(stage, microbatch_id).alive:
                    self.backward_stage(stage, microbatch_id)
                else:
                    self.recover_stage(stage, microbatch_id, replacement_of[stage])
        return self.step(lr)

    def _worker(self, stage: int, microbatch_id: int) -> StageWorker:
        return self.replicas[stage][self._paths[microbatch_id][stage]]

    def _live(self, stage: int) -> list[StageWorker]:
        return [worker for worker in self.replicas[stage] if worker.alive]

    def _inputs_of(self, stage: int, microbatch_id: int) -> StageInputs:
        microbatch = self._microbatches[microbatch_id]
        activations = (
            microbatch["input_ids"]
            if stage == 0
            else self._worker(stage - 1, microbatch_id).sent_output(microbatch_id)
        )
        return StageInputs(activations, microbatch["attention_mask"], microbatch["labels"])

    def _grad_output_of(self, stage: int, microbatch_id: int) -> Tensor | None:
        if stage == len(self.replicas) - 1:
            return None
        return self._worker(stage + 1, microbatch_id).sent_gradient(microbatch_id)

    def _average_gradients(self, stage: int) -> list[Tensor]:
        live = self._live(stage)
        counted = sum(worker.microbatches_in_gradient for worker in live)
        if counted == 0:
            raise RuntimeError(f"no live replica of stage {stage} holds a gradient to average")
        totals = [torch.zeros_like(parameter) for parameter in live[0].stage.parameters()]
        for worker in live:
            if worker.microbatches_in_gradient:
                for total, parameter in zip(totals, worker.stage.parameters(), strict=True):
                    total.add_(parameter.grad)
        return [total / counted for total in totals]

    def _sum_tied_embedding_gradients(self, averaged: list[list[Tensor]]) -> None:
        """Keep a tied embedding and head equal when they live on different stages.

        Autograd would sum the two gradients of the shared matrix; with the copies split across
        stages the sum is done here (as Megatron-LM's embedding group does), then both apply it.
        """
        first, last = self._live(0)[0].stage, self._live(-1)[0].stage
        if first is last or not first.config.tie_word_embeddings:
            return
        embedding_position = _position_of(first, first.embed_tokens.weight)
        head_position = _position_of(last, last.lm_head.weight)
        tied = averaged[0][embedding_position] + averaged[-1][head_position]
        averaged[0][embedding_position] = averaged[-1][head_position] = tied


def _position_of(stage: Stage, target: nn.Parameter) -> int:
    return next(i for i, parameter in enumerate(stage.parameters()) if parameter is target)
