"""Fixtures shared by several test modules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

POSITIVE = ["a delight", "wonderful acting", "moving and funny", "a real gem"]
NEGATIVE = ["a bore", "dreadful pacing", "flat and dull", "a total mess"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    (root / "sst2").mkdir()
    for split, count in (("train", 120), ("validation", 40)):
        rows = [
            {"idx": i, "sentence": (POSITIVE if i % 2 else NEGATIVE)[i % 4], "label": i % 2}
            for i in range(count)
        ]
        (root / "sst2" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """The tiny model's steps are too small to share between threads (and slow when the cores are
    busy); runs killed in child processes have one thread, and runs here must add in their order."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
