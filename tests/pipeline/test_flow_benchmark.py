"""benchmarks/flow_convergence.py on a tiny shape: its record is whole, and the decentralized flow
settles at the optimum's microbatches there."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "flow_convergence.py"


def test_flow_benchmark_records_every_run_at_the_optimum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("flow_convergence", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    arguments = ["--stages", "3", "--relays", "2", "3", "--seeds", "2", "--seed0", "5"]
    script.main([*arguments, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "flow_convergence.json").read_text())
    assert result["machine"]["cores"] and (result["seeds"], result["seed0"]) == (2, 5)
    assert [(s["stages"], s["relays_per_stage"]) for s in result["shapes"]] == [(3, 2), (3, 3)]
    assert [(r["relays_per_stage"], r["seed"]) for r in result["runs"]] == [
        (2, 5),
        (2, 6),
        (3, 5),
        (3, 6),
    ]
    for run in result["runs"]:
        assert run["settled"] and run["routed"] == run["optimum"] > 0
        assert run["ticks"] > 0 and run["messages"] > 0
        assert 0 < run["slowest_ratio"] < 1.1 and 0 < run["total_ratio"] < 1.1
    for shape in result["shapes"]:
        assert (shape["runs"], shape["short"], shape["unsettled"]) == (2, 0, 0)
        assert shape["ticks_max"] <= shape["tick_limit"]
        assert shape["slowest_ratio_median"] <= shape["slowest_ratio_max"]
    assert "| 3 x 2 | 2 | 0 | 0 |" in capsys.readouterr().out
