"""benchmarks/gpu.py is meant for one call on a lent GPU, where a failure costs the lease: here it
runs on the CPU with the smallest settings, so that its record is known to be whole."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu.py"


@pytest.mark.slow
def test_gpu_benchmark_writes_every_row_with_a_positive_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    monkeypatch.delenv("SEEDFLOOD_DATA_DIR", raising=False)  # the synthetic task, no data needed
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    arguments = "--device cpu --clients 2 --reps 1 --warmup 0 --layers 1 --batch 2 --profile"
    monkeypatch.setattr(sys, "argv", ["gpu.py", *arguments.split(), "--out", str(tmp_path)])
    script.main()
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert result["device"] == "cpu" and result["torch"] and result["machine"]["cores"]
    assert result["model"]["hidden_size"] == 576 and result["data"] == "synthetic sst2"
    assert [(row["clients"], row["dtype"]) for row in result["rows"]] == [(2, "fp32"), (2, "bf16")]
    for row in result["rows"]:
        for key in ("plain_forward_seconds", "round_seconds", "ratio", "padding_ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, key
        assert row["padded_tokens"] >= row["real_tokens"] > 0
        assert row["profile"] and all(op["self_ms"] > 0 for op in row["profile"])
