"""A results tree with the main grid, hops, benchmarks and pipeline runs that most document
tests start from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paper.fabricate import write_bench, write_pipeline, write_run


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_bench(tmp_path)
    write_pipeline(tmp_path)
    for method, accuracy in (("seedflood", 0.75), ("dsgd", 0.80), ("dzsgd", 0.6)):
        for seed, shift in ((0, 0.01), (1, -0.01)):
            name = f"{method}_topology-ring_clients-16_seed-{seed}"
            # gossip clients hold models 20 points worse than their average
            own = accuracy + shift - (0.2 if method == "dsgd" else 0.0)
            write_run(tmp_path, "paper-main-sst2", name, accuracy + shift, seed=seed,
                      method=method, client_accuracy=own)  # fmt: skip
    for hops, accuracy in ((1, 0.55), (4, 0.71), (None, 0.72)):
        name = f"hops-{hops or 'diameter'}_seed-0"
        write_run(tmp_path, "paper-hops", name, accuracy, clients=64, hops=hops)
    return tmp_path
