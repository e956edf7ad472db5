"""benchmarks/crash_recovery.py on two thin stages of SmolLM2's shape: each crash makes its own
stage, and only it, run one forward and one backward again, and the iteration ends as the calm
one did."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "crash_recovery.py"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("crash_recovery", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_each_crash_reruns_only_its_stage_and_keeps_the_calm_result(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["--layers", "2", "--stages", "2", "--microbatches", "3", "--seq-len", "8"]
    script.main([*arguments, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "crash_recovery.json").read_text())
    assert (result["layers"], result["stages"], result["microbatches"]) == (2, 2, 3)
    assert result["machine"]["cores"] and result["restart_seconds"] > 0
    assert [c["stage"] for c in result["crashes"]] == [0, 1]
    for crash, only in zip(result["crashes"], ([1, 0], [0, 1]), strict=True):
        assert crash["extra_forwards"] == crash["extra_backwards"] == only
        assert crash["loss_equal"] is True
        assert 0 <= crash["weight_gap"] < 1e-4
        assert crash["recovery_seconds"] > 0
    assert "| 1 | [0, 1] | [0, 1] | True |" in capsys.readouterr().out


def test_a_pipeline_needs_two_stages_and_two_microbatches(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in (["--stages", "1"], ["--microbatches", "1"]):
        with pytest.raises(SystemExit):
            script.main([*bad, "--out", str(tmp_path)])
        assert "must be at least 2" in capsys.readouterr().err
    assert not (tmp_path / "crash_recovery.json").exists()
