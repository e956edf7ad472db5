"""Tests for seedflood.learning.tasks.partition: how training examples are dealt to clients,
uniformly or with Dirichlet label skew, every example exactly once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.learning.tasks import DataError, Example, partition


def labelled(n: int, n_classes: int = 2) -> list[Example]:
    return [Example(f"p{i}", ("a", "b", "c")[:n_classes], i % n_classes) for i in range(n)]


def test_uniform_partition_is_balanced_exact_and_deterministic() -> None:
    examples = labelled(10)
    shards = partition(examples, 3, seed=1)
    assert sorted(len(shard) for shard in shards) == [3, 3, 4]
    assert Counter(e for shard in shards for e in shard) == Counter(examples)
    assert partition(examples, 3, seed=1) == shards
    assert partition(examples, 3, seed=2) != shards


def max_class_fraction(shards: list[list[Example]]) -> float:
    return float(np.mean([max(Counter(e.label for e in s).values()) / len(s) for s in shards]))


def test_dirichlet_partition_skews_labels_and_feeds_every_client() -> None:
    examples = labelled(400, n_classes=2)
    skewed = partition(examples, 8, seed=0, scheme="dirichlet", alpha=0.1)
    uniform = partition(examples, 8, seed=0)
    assert all(skewed)
    assert Counter(e for shard in skewed for e in shard) == Counter(examples)
    assert max_class_fraction(skewed) > 0.8
    assert max_class_fraction(uniform) < 0.65
    assert partition(examples, 8, seed=0, scheme="dirichlet", alpha=0.1) == skewed


def test_dirichlet_with_one_example_per_client() -> None:
    examples = labelled(6, n_classes=3)
    shards = partition(examples, 6, scheme="dirichlet", alpha=0.01)
    assert sorted(len(shard) for shard in shards) == [1] * 6
    assert Counter(e for shard in shards for e in shard) == Counter(examples)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    data=st.data(),
    scheme=st.sampled_from(["uniform", "dirichlet"]),
    alpha=st.floats(0.01, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_partition_uses_every_example_once(
    n: int, data: st.DataObject, scheme: str, alpha: float, seed: int
) -> None:
    n_clients = data.draw(st.integers(1, n))
    examples = labelled(n, n_classes=3)
    shards = partition(examples, n_clients, seed=seed, scheme=scheme, alpha=alpha)
    assert len(shards) == n_clients
    assert all(shards)
    assert Counter(e for shard in shards for e in shard) == Counter(examples)
    if scheme == "uniform":
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_partition_errors() -> None:
    with pytest.raises(
        DataError,
        match=r"^16 clients but only 8 training examples: every client needs one; use fewer",
    ):
        partition(labelled(8), 16)
    with pytest.raises(
        DataError, match=r"unknown partition scheme 'iid'; allowed: uniform, dirichlet"
    ):
        partition(labelled(8), 2, scheme="iid")
    with pytest.raises(DataError, match=r"alpha must be > 0, got 0"):
        partition(labelled(8), 2, scheme="dirichlet", alpha=0.0)
    with pytest.raises(DataError, match=r"n_clients must be >= 1, got 0"):
        partition(labelled(8), 0)
