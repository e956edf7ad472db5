"""A tiny SST-2-shaped task that the tiny model learns in seconds: tests and CPU benchmarks.

The label is whether the phrase is one of four positive ones, so a few dozen ZO steps move
accuracy far from chance, and no download or data directory is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

POSITIVE = ["a delight", "wonderful acting", "moving and funny", "a real gem"]
NEGATIVE = ["a bore", "dreadful pacing", "flat and dull", "a total mess"]


def write_synthetic_sst2(root: Path, train: int = 640, validation: int = 200) -> Path:
    """Write ``root``/sst2/{train,validation}.jsonl and return ``root`` (a data_dir)."""
    (root / "sst2").mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("validation", validation)):
        rows = [
            {"idx": i, "sentence": (POSITIVE if i % 2 else NEGATIVE)[i // 2 % 4], "label": i % 2}
            for i in range(count)
        ]
        (root / "sst2" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root
