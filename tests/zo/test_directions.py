"""Properties of the zeroth-order machinery (MeZO-style: same seed, same weights; replay = step)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from seedflood.zo import (
    DenseDirection,
    SubCGEDirection,
    derive_seed,
    make_direction,
    message_seed,
    trainable_matrices,
    two_point_estimate,
)


class Blocks(nn.Module):
    """A stand-in with the layout SubCGE looks for: linear layers inside ``layers``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(10, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 12), nn.Linear(12, 8)])
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.norm(h)


def quadratic_loss(model: nn.Module) -> float:
    """A smooth deterministic loss of the parameters."""
    return float(sum(((p.detach() - 0.1) ** 2).sum() for p in model.parameters()))


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_derived_seeds_are_deterministic_and_distinct() -> None:
    assert derive_seed(7, "message", 3, 11) == derive_seed(7, "message", 3, 11)
    seeds = {message_seed(7, origin, step) for origin in range(50) for step in range(50)}
    assert len(seeds) == 2500
    assert all(0 <= s < 2**63 for s in seeds)
    assert message_seed(7, 1, 2) != message_seed(8, 1, 2)
    assert derive_seed(0, 1, 23) != derive_seed(0, 12, 3)


@pytest.mark.parametrize("kind", ["dense", "subcge"])
def test_perturb_and_restore_leave_parameters_bit_identical(kind: str) -> None:
    model = Blocks()
    before = state(model)
    direction = make_direction(kind, model, rank=4, refresh=10, run_seed=1)
    for step in range(5):
        touch = direction.touch(message_seed(1, 0, step), step)
        g, mean_loss = two_point_estimate(lambda: quadratic_loss(model), touch, 1e-3)
        assert g != 0.0 and mean_loss > 0
    after = state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_two_point_estimate_matches_directional_derivative() -> None:
    model = Blocks()
    direction = DenseDirection(list(model.parameters()))
    touch = direction.touch(123, 0)
    exact = float(
        sum(
            ((2 * (p.detach() - 0.1)) * u).sum()
            for p, u in zip(model.parameters(), touch.values, strict=True)
        )
    )
    g, _ = two_point_estimate(lambda: quadratic_loss(model), touch, 1e-3)
    assert g == pytest.approx(exact, rel=1e-3)


@pytest.mark.parametrize("kind", ["dense", "subcge"])
def test_replaying_seed_scalar_pairs_equals_stepping(kind: str) -> None:
    """The MeZO property: a fresh copy that replays (seed, step, coef) reaches the same weights."""
    model = Blocks()
    fresh = copy.deepcopy(model)
    direction = make_direction(kind, model, rank=4, refresh=3, run_seed=5)
    log = []
    for step in range(12):
        seed = message_seed(5, 0, step)
        g, _ = two_point_estimate(lambda: quadratic_loss(model), direction.touch(seed, step), 1e-3)
        update = (seed, step, -1e-3 * g)
        direction.apply([update])
        log.append(update)
    assert quadratic_loss(model) < quadratic_loss(fresh)
    make_direction(kind, fresh, rank=4, refresh=3, run_seed=5).apply(log)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )


def test_subcge_message_touches_only_the_rows_it_claims() -> None:
    model = Blocks()
    before = state(model)
    direction = SubCGEDirection(trainable_matrices(model), rank=4, refresh=10, run_seed=0)
    seed = message_seed(0, 2, 9)
    rows, _, _ = direction.coordinates(seed)
    direction.apply([(seed, 9, 0.5)])
    after = state(model)
    for index, name in enumerate(["layers.0.weight", "layers.1.weight"]):
        changed = (after[name] != before[name]).any(dim=1).nonzero().flatten().tolist()
        assert changed == [int(rows[index])]
    untouched = [k for k in before if k not in ("layers.0.weight", "layers.1.weight")]
    assert all(torch.equal(before[k], after[k]) for k in untouched)


def test_subcge_batched_apply_equals_one_by_one_and_region_restores() -> None:
    model, other = Blocks(), Blocks()
    updates = [(message_seed(0, o, s), s, 0.01 * (o - s)) for s in range(4) for o in range(6)]
    batched = SubCGEDirection(trainable_matrices(model), rank=4, refresh=2, run_seed=0)
    single = SubCGEDirection(trainable_matrices(other), rank=4, refresh=2, run_seed=0)
    region = batched.region(updates)
    saved = region.save()
    original = state(model)
    batched.apply(updates)
    for update in updates:
        single.apply([update])
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True)
    )
    assert not torch.equal(model.layers[0].weight, original["layers.0.weight"])
    region.restore(saved)
    assert all(torch.equal(original[k], v) for k, v in model.state_dict().items())


def test_subcge_merged_apply_matches_scatter_apply() -> None:
    scattered, merged = Blocks(), Blocks()
    updates = [(message_seed(0, o, s), s, 0.01 * (o + 1)) for s in range(5) for o in range(40)]
    SubCGEDirection(trainable_matrices(scattered), rank=4, refresh=3, run_seed=0).apply(updates)
    SubCGEDirection(trainable_matrices(merged), rank=4, refresh=3, run_seed=0).apply_merged(updates)
    for a, b in zip(scattered.parameters(), merged.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert not torch.equal(scattered.layers[0].weight, Blocks().layers[0].weight)


@pytest.mark.slow
def test_subcge_direction_second_moment_is_the_subspace_projector() -> None:
    """E[u uᵀ] = I_m ⊗ V Vᵀ per matrix, checked by Monte Carlo with a fixed seed."""
    matrix = nn.Parameter(torch.zeros(3, 6))
    direction = SubCGEDirection([matrix], rank=2, refresh=1000, run_seed=3)
    samples = 40_000
    second = torch.zeros(18, 18, dtype=torch.float64)
    for k in range(samples):
        touch = direction.touch(derive_seed(3, "moment", k), 0)
        u = torch.zeros(3, 6, dtype=torch.float64)
        rows, _, _ = direction.coordinates(derive_seed(3, "moment", k))
        u[int(rows[0])] = touch.values[0].double()
        flat = u.flatten()
        second += torch.outer(flat, flat)
    second /= samples
    v = direction.basis(0)[0].double().T
    projector = torch.kron(torch.eye(3, dtype=torch.float64), v @ v.T)
    assert torch.allclose(v.T @ v, torch.eye(2, dtype=torch.float64), atol=1e-6)
    assert (second - projector).abs().max() < 0.05
    assert torch.trace(second).item() == pytest.approx(3 * 2, rel=1e-6)


def test_subcge_rejects_rank_above_matrix_dimension() -> None:
    with pytest.raises(ValueError, match=r"rank must be between 1 and .*8.*got 9"):
        SubCGEDirection(trainable_matrices(Blocks()), rank=9, refresh=10, run_seed=0)
    with pytest.raises(ValueError, match="direction must be one of"):
        make_direction("sparse", Blocks(), rank=2, refresh=10, run_seed=0)


def test_message_seeds_use_all_their_bits() -> None:
    """torch.Generator keeps a seed's low 32 bits; directions must not: seeds s and s + 2^32
    draw different SubCGE coordinates and different dense directions."""
    model = Blocks()
    subcge = make_direction("subcge", model, rank=4, refresh=10, run_seed=0)
    seed = message_seed(0, 41, 300)
    low = seed % 2**32
    assert not all(
        torch.equal(a, b)
        for a, b in zip(subcge.coordinates(low), subcge.coordinates(low + 2**32), strict=True)
    )
    dense = make_direction("dense", model, rank=4, refresh=10, run_seed=0)
    first, second = dense.touch(low, 0).values, dense.touch(low + 2**32, 0).values
    assert not torch.equal(first[0], second[0])
    assert torch.equal(dense.touch(low, 0).values[0], first[0])  # and a seed is one direction
