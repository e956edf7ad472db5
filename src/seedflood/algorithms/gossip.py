"""Gossip baselines: DSGD, ChocoSGD and DZSGD, on full parameters or LoRA adapters.

The three differ in two choices only, so they are one class with two switches rather than three
copies of a training loop:

- the local estimate: the gradient (DSGD, ChocoSGD) or MeZO's dense two-point estimate (DZSGD);
- the communication: exact averaging x_i ← Σ_j W_ij x_j of full fp32 vectors (DSGD, DZSGD), or
  ChocoSGD's compressed consensus (Koloskova et al., 2019) with top-k differences.

A round is ``local_steps`` local updates on every client followed by one communication (the
paper's "communicate every 5 local updates"), so with local_steps = 1 DSGD is
x_i ← Σ_j W_ij (x_j − η ∇f_j(x_j)).

Under LoRA the trainable parameters are the adapters' linear weights alone, so DZSGD-LoRA can
score all clients' perturbed adapters in shared batched forwards (``batched``,
seedflood.algorithms.batched).

DZSGD's state after a round is a function of its start and the scalars its clients' two-point
estimates gave (the directions are drawn from seeds, and mixing is fixed): every scalar made is
kept for the run's ledger (``take_scalars``) and ``replay_round`` redoes a round from them with
no forward pass, the same arithmetic bit for bit (seedflood.sim.scalar_ledger). The same scalars
feed SeedFlood's divergence guard (seedflood.protocol.guard), so a diverging rate stops here too.

Clients' trainable parameters live as rows of one (n × d) matrix. The shared working model's
trainable tensors are re-pointed at a row to compute with that client, so switching clients copies
nothing; the frozen rest of the model (the whole base model under LoRA) is shared by all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from seedflood.algorithms.batched import row_weight_losses
from seedflood.algorithms.common import sample_batch
from seedflood.learning.schedules import Rate, as_rate
from seedflood.learning.scoring import TokenizedExample, batch_loss, loss_and_correct
from seedflood.protocol.guard import DivergenceGuard, Tripped, guard_record
from seedflood.protocol.traffic import TrafficCounter
from seedflood.topology import Topology
from seedflood.zo import DenseDirection, DrawsAhead, message_seed

FP32_BYTES = 4
INDEX_BYTES = 4
CHUNK = 1 << 20
WORKING_VECTORS = 8
"""Model-sized vectors a full-parameter run holds besides its client states: DZSGD's direction
and perturbed copy, the clients' mean, gradients, the loaded weights, and torch and the data at
about their size. Measured as peak RSS on SmolLM2-135M with 16 clients, less the states: 8.0
(DZSGD, SST-2), 8.6 (DSGD, SST-2), 9.8 (DSGD, RTE's longer prompts) and 8.8 (ChocoSGD, SST-2)."""


class Gossip:
    """n clients, each with its own copy of the trainable parameters, mixing with neighbours."""

    def __init__(
        self,
        *,
        model: nn.Module,
        trainable: Sequence[nn.Parameter],
        topology: Topology,
        shards: Sequence[Sequence[TokenizedExample]],
        pad_id: int,
        estimator: str,
        lr: float | Rate,
        eps: float | Rate,
        batch_size: int,
        local_steps: int,
        mixing: str,
        topk_ratio: float | None,
        gamma: float,
        run_seed: int,
        batched: bool = False,
        draw_workers: int = 0,
        guard: DivergenceGuard | None = None,
    ) -> None:
        if estimator not in ("gradient", "zo"):
            raise ValueError(f"estimator must be 'gradient' or 'zo', got {estimator!r}")
        if guard is not None and estimator != "zo":
            raise ValueError("the divergence guard reads two-point scalars: only zo makes them")
        if batched and (estimator != "zo" or not _all_linear_weights(model, trainable)):
            raise ValueError(
                "batched forwards need the zo estimator and trainable parameters that are all "
                "weights of bias-free linear layers (LoRA adapters)"
            )
        self.batched = batched
        self.model = model
        self.params = list(trainable)
        self.topology = topology
        self.n = topology.n
        self.shards = shards
        self.pad_id = pad_id
        self.estimator = estimator
        self.lr, self.eps = as_rate(lr), as_rate(eps)
        self.batch_size = batch_size
        self.local_steps = local_steps
        self.gamma = gamma
        self.run_seed = run_seed
        self.d = sum(p.numel() for p in self.params)
        self.k = None if topk_ratio is None else max(1, round(topk_ratio * self.d))
        self.message_bytes = (
            self.d * FP32_BYTES if self.k is None else self.k * (FP32_BYTES + INDEX_BYTES)
        )
        initial = torch.cat([p.detach().flatten() for p in self.params])
        self.x = initial.repeat(self.n, 1)
        self.x_hat = None if self.k is None else torch.zeros_like(self.x)
        self.mixing = mixing_operator(topology.mixing_matrix(mixing), self.x.device)
        self.counter = TrafficCounter(topology.neighbors)
        for p in self.params:
            p.requires_grad_(estimator == "gradient")
        self._bind(self.x[0])
        self._direction = DenseDirection(self.params)
        self.draw_workers = draw_workers
        self._ahead: DrawsAhead | None = None
        self._ahead_buffers: list[torch.Tensor] = []
        self._gaussian: torch.Tensor | None = None
        self._gaussian_parts: list[torch.Tensor] = []
        self._gaussian_on_device: torch.Tensor | None = None
        self._perturbed: torch.Tensor | None = None
        self._scalars: list[float] = []
        self.guard = guard
        self.tripped: Tripped | None = None

    def _bind(self, vector: torch.Tensor) -> None:
        """Point the model's trainable tensors at ``vector``: updates then land in it in place."""
        offset = 0
        for p in self.params:
            p.data = vector[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    @contextmanager
    def _bound(self, vector: torch.Tensor) -> Iterator[None]:
        self._bind(vector)
        yield

    def client_view(self, client: int) -> Any:
        return self._bound(self.x[client])

    def global_view(self) -> Any:
        return self._bound(self.x.mean(dim=0))

    def clients_identical(self) -> bool:
        return bool((self.x == self.x[0]).all())

    def consensus_distance(self) -> float:
        """(1/n) Σ_i ‖x_i − x̄‖², in float64 one row at a time: a float64 copy of all rows (which
        ``mean(dtype=float64)`` makes) would double the largest allocation of the run."""
        mean = torch.zeros(self.d, dtype=torch.float64)
        for row in self.x:
            mean += row
        mean /= self.n
        return float(sum(((row.double() - mean) ** 2).sum() for row in self.x) / self.n)

    def local_step(self, client: int, step: int) -> float:
        """One local update of ``client``'s row; returns the minibatch loss."""
        self._bind(self.x[client])
        batch = sample_batch(self.shards[client], client, step, self.batch_size, self.run_seed)
        if self.estimator == "gradient":
            self.model.zero_grad(set_to_none=True)
            loss = batch_loss(self.model, batch, self.pad_id)
            loss.backward()
            with torch.no_grad():
                for p in self.params:
                    p.data.add_(p.grad, alpha=-self.lr(step))
            return float(loss.detach())
        return self._zo_step(client, step, batch)

    def _zo_step(self, client: int, step: int, batch: Sequence[TokenizedExample]) -> float:
        """MeZO's step x ← x − η g u on ``client``'s row. The model scores x ± εu bound to a
        scratch vector, so the row is written once and never saved or restored, and the Gaussian
        u is drawn once, into a reused buffer: at 135M parameters a step is a few passes over
        memory, and fresh model-sized allocations would cost as much as the passes."""
        row = self.x[client]
        u = self._draw(message_seed(self.run_seed, client, step))
        if self._perturbed is None:
            self._perturbed = torch.empty_like(row)
        losses = []
        eps = self.eps(step)
        for sign in (1.0, -1.0):
            _add_scaled(row, u, sign * eps, out=self._perturbed)
            self._bind(self._perturbed)
            losses.append(loss_and_correct(self.model, batch, self.pad_id)[0])
        self._bind(row)
        plus, minus = losses
        scalar = (plus - minus) / (2.0 * eps)
        self._scalars.append(scalar)
        _add_scaled(row, u, -self.lr(step) * scalar, out=row)
        return (plus + minus) / 2.0

    def _update_one(self, client: int, step: int, scalar: float) -> None:
        """``_zo_step``'s update of ``client``'s row from its logged scalar."""
        u = self._draw(message_seed(self.run_seed, client, step))
        _add_scaled(self.x[client], u, -self.lr(step) * scalar, out=self.x[client])

    def _draw(self, seed: int) -> torch.Tensor:
        """DenseDirection's u for ``seed`` as one flat vector, drawn ahead by the workers or here
        into a reused CPU buffer (then copied to the rows' device)."""
        if self._ahead is not None:
            drawn = self._ahead.take(seed)
        else:
            if self._gaussian is None:
                self._gaussian = torch.empty(self.d, device="cpu")
                self._gaussian_parts = list(self._gaussian.split(self._sizes))
            self._direction.draw_into(seed, self._gaussian_parts)
            drawn = self._gaussian
        if self.x.device.type == "cpu":
            return drawn
        if self._gaussian_on_device is None:
            self._gaussian_on_device = torch.empty_like(self.x[0])
        return self._gaussian_on_device.copy_(drawn)

    @property
    def _sizes(self) -> list[int]:
        return [p.numel() for p in self.params]

    @contextmanager
    def _drawn_ahead(self, steps: range) -> Iterator[None]:
        """Client by client zeroth-order ``steps`` with their directions drawn ahead on
        ``draw_workers`` threads (seedflood.zo.ahead): the same values, drawn beside the work."""
        if not self.draw_workers or self.estimator != "zo" or self.batched:
            yield
            return
        seeds = [message_seed(self.run_seed, c, step) for step in steps for c in range(self.n)]
        if not self._ahead_buffers:
            self._ahead_buffers = [torch.empty(self.d) for _ in range(self.draw_workers + 1)]
        with DrawsAhead(self._direction, self._sizes, seeds, self._ahead_buffers) as ahead:
            self._ahead = ahead
            try:
                yield
            finally:
                self._ahead = None

    def _directions(self, step: int) -> torch.Tensor:
        """Every client's direction at ``step``, one row each."""
        draw = self._direction
        return torch.stack(
            [
                torch.cat(
                    [
                        v.flatten()
                        for v in draw.touch(message_seed(self.run_seed, c, step), step).values
                    ]
                )
                for c in range(self.n)
            ]
        )

    def _update_all(self, directions: torch.Tensor, step: int, scalars: Sequence[float]) -> None:
        lr = self.lr(step)
        for client, scalar in enumerate(scalars):
            self.x[client].add_(directions[client] * (-lr * scalar))

    def _zo_steps_batched(self, step: int) -> list[float]:
        """``local_step`` of every client at once: the 2n perturbed adapters x_c ± εu_c are scored
        in shared forwards, then each row takes the same update as one client at a time."""
        directions = self._directions(step)
        eps = self.eps(step)
        perturbed = torch.stack([self.x + directions * eps, self.x + directions * -eps], dim=1)
        perturbed = perturbed.flatten(0, 1)
        batches = [
            sample_batch(self.shards[client], client, step, self.batch_size, self.run_seed)
            for client in range(self.n)
        ]
        losses = row_weight_losses(
            self.model,
            self.params,
            perturbed,
            [batch for batch in batches for _ in range(2)],
            self.pad_id,
        )
        pairs = list(zip(losses[0::2], losses[1::2], strict=True))
        scalars = [(plus - minus) / (2.0 * eps) for plus, minus in pairs]
        self._scalars.extend(scalars)
        self._update_all(directions, step, scalars)
        return [(plus + minus) / 2.0 for plus, minus in pairs]

    def communicate(self) -> None:
        """One exchange with every neighbour, counted on every directed edge."""
        if self.x_hat is None:
            for columns, mixed in mixed_chunks(self.mixing, self.x):
                self.x[:, columns] = mixed
        else:
            for client in range(self.n):
                difference = self.x[client] - self.x_hat[client]
                indices = difference.abs().topk(self.k, sorted=False).indices
                self.x_hat[client, indices] += difference[indices]
            for columns, mixed in mixed_chunks(self.mixing, self.x_hat):
                self.x[:, columns] += self.gamma * (mixed - self.x_hat[:, columns])
        for sender, receiver in self.topology.directed_edges:
            self.counter.count(sender, receiver, size=self.message_bytes, messages=1)

    def _steps(self, round_index: int) -> range:
        return range(round_index * self.local_steps, (round_index + 1) * self.local_steps)

    def run_round(self, round_index: int) -> dict[str, float]:
        steps = self._steps(round_index)
        if self.batched:
            losses = [loss for step in steps for loss in self._zo_steps_batched(step)]
        else:
            with self._drawn_ahead(steps):
                losses = [self.local_step(c, step) for step in steps for c in range(self.n)]
        self.communicate()
        if self.estimator == "zo":
            self._watch(round_index, self._scalars[-len(losses) :])
        return {"train_loss": sum(losses) / len(losses)}

    def _watch(self, round_index: int, scalars: Sequence[float]) -> None:
        """Show the guard the round's steps in order, each as its clients' scalars, until one
        trips it (the run then stops after this round: ``stop_reason``)."""
        if self.guard is None or self.tripped is not None:
            return
        for offset, step in enumerate(self._steps(round_index)):
            made = scalars[offset * self.n : (offset + 1) * self.n]
            if tripped := self.guard.check_scalars(step, made):
                self.tripped = tripped
                return

    def take_scalars(self) -> list[float]:
        """The scalars of the zeroth-order steps since the last call, step by step and in client
        order within a step; empty for gradient methods."""
        taken, self._scalars = self._scalars, []
        return taken

    def replay_round(self, round_index: int, scalars: Sequence[float]) -> None:
        """Round ``round_index`` of a zeroth-order run from the scalars ``take_scalars`` gave
        for it, without a forward pass: the rows end bit for bit where the round left them."""
        if self.estimator != "zo" or len(scalars) != self.n * self.local_steps:
            raise ValueError(
                f"a round replays from {self.n * self.local_steps} scalars of a zeroth-order "
                f"run; got {len(scalars)} for a {self.estimator} run"
            )
        steps = self._steps(round_index)
        with self._drawn_ahead(steps):
            for offset, step in enumerate(steps):
                made = scalars[offset * self.n : (offset + 1) * self.n]
                if self.batched:
                    self._update_all(self._directions(step), step, made)
                else:
                    for client, scalar in enumerate(made):
                        self._update_one(client, step, scalar)
        self.communicate()
        self._watch(round_index, scalars)

    def traffic(self) -> dict[str, float]:
        return self.counter.summary()

    def stop_reason(self) -> str | None:
        """Why the run must stop now: the divergence guard tripped on a zeroth-order step. The
        round it fell in was completed, so the clients keep the refused step."""
        if self.tripped is None:
            return None
        step = self.tripped.step
        last = self._steps(step // self.local_steps)[-1]
        kept = (
            f"its clients' models after step {last}, the refused step included: gossip clients "
            "apply a step as they make it"
        )
        return self.tripped.explain(self.lr(step), kept)

    def describe(self) -> dict[str, Any]:
        return {
            "guard": guard_record(self.guard, self.tripped),
            "trainable_parameters": self.d,
            "estimator": self.estimator,
            "bytes_per_message": self.message_bytes,
            # a GPU run without "dense" here mixed with the sparse product that zeroed states
            "mixing_operator": "sparse" if self.mixing.is_sparse else "dense",
        }


def mixing_operator(matrix: np.ndarray, device: torch.device) -> torch.Tensor:
    """W as the tensor that mixes client states on ``device``: sparse on the CPU, where a ring's
    three entries a row are all the product reads; dense on a GPU, where torch 2.11's sparse
    product of a 16 × 16 W with 16 × 10⁶ states returned zeros on an H200 (COO from 10⁶ columns,
    CSR at 1.7 × 10⁷; results/bench/gpu-fo/sparse-products-h200.json), so DSGD and ChocoSGD runs
    there fell to a loss of ln 2. The dense n × n product costs a GPU little beside the states."""
    mixing = torch.from_numpy(matrix).float()
    return mixing.to(device) if device.type == "cuda" else mixing.to_sparse()


def mixed_chunks(
    mixing: torch.Tensor, matrix: torch.Tensor
) -> Iterator[tuple[slice, torch.Tensor]]:
    """(W · matrix) chunk of columns by chunk, so mixing needs no second n × d buffer.

    Each chunk is copied contiguous before the product: a column slice keeps the row stride d,
    an operand of n × d elements to the library (2.15 × 10⁹ for 16 clients of SmolLM2-135M,
    past 32-bit indexing). On the CPU the product is the same either way, bit for bit."""
    d = matrix.shape[1]
    for start in range(0, d, CHUNK):
        columns = slice(start, min(start + CHUNK, d))
        yield columns, mixing @ matrix[:, columns].contiguous()


def _add_scaled(x: torch.Tensor, u: torch.Tensor, coef: float, *, out: torch.Tensor) -> None:
    """out = x + (coef · u), chunk by chunk through a cache-sized buffer: the product is rounded
    before the sum (no fused multiply-add), as ``Touch.add_`` rounds it, so the result is the
    same bit for bit, while memory sees only x, u and out pass."""
    scaled = torch.empty(min(CHUNK, len(x)), dtype=x.dtype, device=x.device)
    for start in range(0, len(x), CHUNK):
        end = min(start + CHUNK, len(x))
        product = scaled[: end - start]
        torch.mul(u[start:end], coef, out=product)
        torch.add(x[start:end], product, out=out[start:end])


def _all_linear_weights(model: nn.Module, params: Sequence[nn.Parameter]) -> bool:
    linear = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, nn.Linear) and module.bias is None
    }
    return all(id(p) in linear for p in params)


def gossip_memory_bytes(
    clients: int, trainable: int, compressed: bool, batched: bool, draw_workers: int = 0
) -> int:
    """What a run's process peaks at: the client states (x for every client, ChocoSGD's public
    copies x̂, batched DZSGD's directions and two perturbed copies) plus WORKING_VECTORS, and one
    buffer more a thread drawing full DZSGD's directions ahead (one of them in place of the
    working vector a direction is drawn into without them)."""
    per_client = 1 + (1 if compressed else 0) + (3 if batched else 0)
    vectors = clients * per_client + WORKING_VECTORS + draw_workers
    return vectors * trainable * FP32_BYTES
