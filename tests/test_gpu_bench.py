"""benchmarks/gpu.py is meant for one call on a lent GPU, where a failure costs the lease: here it
runs on the CPU with the smallest settings, so that its record is known to be whole."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from seedflood.algorithms import seedflood as seedflood_module
from seedflood.algorithms.graphs import ForwardGraphs
from tests.algorithms.test_graphs import eager_record

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
    # CUDA graphs exist only on a GPU: an eager recorder stands in for them (tests/algorithms/
    # test_graphs.py), so that the rows with graphs run the same code as on a GPU
    eager_graphs = functools.partial(ForwardGraphs, record=eager_record)
    monkeypatch.setattr(seedflood_module, "forward_graphs", lambda device: eager_graphs())
    monkeypatch.setattr(script, "ForwardGraphs", eager_graphs)
    arguments = "--device cpu --clients 2 --reps 2 --warmup 0 --layers 1 --batch 2 --profile"
    arguments += " --graphs on off"
    monkeypatch.setattr(sys, "argv", ["gpu.py", *arguments.split(), "--out", str(tmp_path)])
    script.main()
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert result["device"] == "cpu" and result["torch"] and result["machine"]["cores"]
    assert result["model"]["hidden_size"] == 576 and result["data"] == "synthetic sst2"
    assert [(row["clients"], row["dtype"], row["graphs"]) for row in result["rows"]] == [
        (2, dtype, graphs) for dtype in ("fp32", "bf16") for graphs in (True, False)
    ]
    for row in result["rows"]:
        assert ("plain_forward_graphed_seconds" in row) == row["graphs"]
        if row["graphs"]:  # bf16 forwards replayed once a shape is seen again; fp32 eager
            for use in row["graph_use"].values():
                assert use["failure"] is None
                if row["dtype"] == "fp32":
                    assert use["recorded"] == use["replayed"] == 0
                else:
                    assert use["replayed"] >= use["recorded"] >= 1
            assert (
                math.isfinite(row["ratio_to_graphed_plain"]) and row["ratio_to_graphed_plain"] > 0
            )
        for key in ("plain_forward_seconds", "round_seconds", "ratio", "padding_ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, key
        assert row["padded_tokens"] >= row["real_tokens"] > 0
        assert row["profile"] and all(op["self_ms"] > 0 for op in row["profile"])
