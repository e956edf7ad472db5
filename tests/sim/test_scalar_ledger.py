"""A zeroth-order gossip run resumes from its scalar ledger alone, as a run committed between
sessions without its model-sized checkpoint must."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import load_config
from seedflood.sim.checkpoint import (
    CHECKPOINT_NAME,
    KILL_AT_VARIABLE,
    KILL_ROUND_VARIABLE,
    checkpoint_round,
)
from seedflood.sim.ledger import LAST_ROUND
from seedflood.sim.run_ledgers import untrained_hash
from seedflood.sim.runner import build, run
from seedflood.sim.scalar_ledger import SCALARS, resume_from_scalars, step_means
from tests.forked import seedflood_in_child
from tests.sim.test_ledger import QUICKSTART
from tests.sim.test_ledger import SETTINGS as SEEDFLOOD_SETTINGS

SETTINGS = (*SEEDFLOOD_SETTINGS, "method=dzsgd", "lora=true", "rounds=7")
TIMING = {"wall_seconds", "train_seconds", "peak_rss_mb", "peak_device_mb"}

pytestmark = pytest.mark.usefixtures("one_thread")


def sets(data_dir: Path, *extra: str) -> list[str]:
    return [*SETTINGS, f"data_dir={data_dir}", *extra]


def cli_args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    args = ["run", str(QUICKSTART), "--out", str(out), "--resume"]
    for override in sets(data_dir, *extra):
        args += ["--set", override]
    return args


def killed_without_checkpoint(data_dir: Path, out: Path, kill_round: int) -> None:
    """The run killed after round ``kill_round`` was whole, its checkpoint then lost, as a run
    committed at a session's end is found by the next."""
    fault = {KILL_ROUND_VARIABLE: str(kill_round), KILL_AT_VARIABLE: "checkpoint"}
    assert seedflood_in_child(cli_args(data_dir, out), fault) == 137
    assert json.loads((out / LAST_ROUND).read_text())["round"] == kill_round
    (out / CHECKPOINT_NAME).unlink()


def without_timing(record: dict) -> dict:
    return {key: value for key, value in record.items() if key not in TIMING}


@pytest.fixture(scope="module")
def whole(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return json.loads(
        json.dumps(run(load_config(QUICKSTART, sets(data_dir)), tmp_path_factory.mktemp("whole")))
    )


@pytest.mark.slow  # real `seedflood run` processes killed mid-run
def test_a_killed_run_without_its_checkpoint_resumes_from_its_scalars(
    data_dir: Path, tmp_path: Path, whole: dict
) -> None:
    killed_without_checkpoint(data_dir, tmp_path, 5)
    lines = (tmp_path / SCALARS).read_text().splitlines()
    assert len(lines) == 1 + 5 and len(json.loads(lines[1])) == 4  # header, 5 rounds of 4
    assert len((tmp_path / SCALARS).read_bytes()) < 5_000
    result = CliRunner().invoke(app, cli_args(data_dir, tmp_path))
    assert result.exit_code == 0, result.output
    assert "resumed from the ledger at round 5" in " ".join(result.output.split())
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert without_timing(resumed) == without_timing(whole)
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [entry["round"] for entry in history] == [0, 3, 6, 7]
    assert not (tmp_path / SCALARS).exists() and not (tmp_path / LAST_ROUND).exists()


@pytest.mark.slow  # a real `seedflood run` process killed mid-run
def test_a_checkpoint_behind_the_ledger_is_loaded_and_only_the_rounds_after_it_replayed(
    data_dir: Path, tmp_path: Path, whole: dict
) -> None:
    """Killed after round 5 with round 3's checkpoint: the resume loads the checkpoint and
    replays rounds 4 and 5 alone from the ledger (it replayed all five before), and ends as the
    uninterrupted run does."""
    fault = {KILL_ROUND_VARIABLE: "5", KILL_AT_VARIABLE: "checkpoint"}
    assert seedflood_in_child(cli_args(data_dir, tmp_path), fault) == 137
    assert checkpoint_round(tmp_path / CHECKPOINT_NAME) == 3
    events: list[tuple[int, dict]] = []
    resumed = run(
        load_config(QUICKSTART, sets(data_dir)),
        tmp_path,
        lambda done, record: events.append((done, record)),
        resume=True,
    )
    assert [(done, r["total"]) for done, r in events if r["event"] == "replay"] == [(4, 5), (5, 5)]
    notes = [r["text"] for _, r in events if r["event"] == "note"]
    assert any(note.endswith("at round 3 and from its ledger to round 5") for note in notes)
    assert without_timing(json.loads(json.dumps(resumed))) == without_timing(whole)


@pytest.mark.slow
def test_a_ledger_of_another_config_or_start_or_a_damaged_one_is_refused_by_name(
    data_dir: Path, tmp_path: Path
) -> None:
    killed_without_checkpoint(data_dir, tmp_path, 4)
    other = CliRunner().invoke(app, cli_args(data_dir, tmp_path, "lr=0.02"))
    assert other.exit_code == 2
    assert "lr (checkpoint 0.005, now 0.02)" in " ".join(other.output.split())

    config = load_config(QUICKSTART, sets(data_dir))
    path = tmp_path / SCALARS
    header, *rounds = path.read_text().splitlines(keepends=True)
    exp = build(config)
    base = untrained_hash(exp.algorithm)
    assert json.loads(header)["base_hash"] == base
    with pytest.raises(ValueError, match="starts from a model hashing to"):
        resume_from_scalars(tmp_path, config, exp.algorithm, "0" * 64, exp.data_identity)

    path.write_text(header + rounds[0] + "[0.5, 0.25]\n" + "".join(rounds[2:]))
    with pytest.raises(ValueError, match=f"{SCALARS} line 3 is not 4 numbers"):
        resume_from_scalars(tmp_path, config, build(config).algorithm, base, exp.data_identity)

    # A last line cut short by a kill is dropped: the run resumes from the rounds before it, at
    # the last evaluation they reach (round 3), as ledger_round.json names a round beyond them.
    # Each round replayed is told, with how many there are: a long replay takes minutes.
    path.write_text(header + "".join(rounds[:3]) + rounds[3][:7])
    replayed: list[tuple[int, int]] = []
    point = resume_from_scalars(
        tmp_path,
        config,
        build(config).algorithm,
        base,
        exp.data_identity,
        lambda done, total: replayed.append((done, total)),
    )
    assert point is not None and point.round == 3
    assert replayed == [(1, 3), (2, 3), (3, 3)]


DIVERGING = ("lr=30", "rounds=200", "eval_every=100", "guard_warmup=10")


@pytest.mark.slow  # real `seedflood run` processes killed mid-run
@pytest.mark.parametrize("removed", [(), (CHECKPOINT_NAME,)])
def test_a_diverging_rate_is_stopped_by_the_guard_and_stays_stopped_when_resumed(
    data_dir: Path, tmp_path: Path, removed: tuple[str, ...]
) -> None:
    """DZSGD's rate grids stop a diverging rate as SeedFlood's do. Its clients apply a step as
    they make it, so the run ends after the round of the refused step, that step kept. Killed
    there before its results and resumed from its checkpoint or its ledger alone, it ends as the
    uninterrupted run did, not a round on."""
    notes: list[str] = []
    whole = run(
        load_config(QUICKSTART, sets(data_dir, *DIVERGING)),
        tmp_path / "whole",
        lambda _done, record: notes.append(record.get("text", "")),
    )
    guard = whole["guard"]
    assert guard["action"] == "stopped" and guard["rule"] == "spike" and 10 <= guard["step"] < 199
    assert guard["value"] > guard["factor"] * guard["reference"]
    stopped_after = guard["step"] + 1  # one step a round
    history = [json.loads(line) for line in (tmp_path / "whole/history.jsonl").open()]
    assert [entry["round"] for entry in history] == [0, stopped_after]
    kept = f"the run stopped with its clients' models after step {guard['step']}, the refused"
    assert any(kept in note for note in notes)

    cut = tmp_path / "cut"
    fault = {KILL_ROUND_VARIABLE: str(stopped_after), KILL_AT_VARIABLE: "checkpoint"}
    assert seedflood_in_child(cli_args(data_dir, cut, *DIVERGING), fault) == 137
    means = step_means(cut)  # what the guard read, as benchmarks/guard_rule.py reads it
    assert len(means) == stopped_after and means[-1] == pytest.approx(guard["value"], rel=1e-12)
    for name in removed:
        (cut / name).unlink()
    result = CliRunner().invoke(app, cli_args(data_dir, cut, *DIVERGING))
    assert result.exit_code == 0, result.output
    resumed = json.loads((cut / "results.json").read_text())
    assert without_timing(resumed) == without_timing(json.loads(json.dumps(whole)))


@pytest.mark.slow  # a real `seedflood run` process killed mid-run
def test_a_ledger_that_runs_past_the_guards_stop_is_refused_by_name(
    data_dir: Path, tmp_path: Path
) -> None:
    """A ledger written before the guard watched DZSGD goes on past the round where the guard now
    stops the run: resuming from it would end on a model the guard never allowed."""
    unguarded = [*DIVERGING, "guard_factor=null"]
    fault = {KILL_ROUND_VARIABLE: "100", KILL_AT_VARIABLE: "checkpoint"}
    assert seedflood_in_child(cli_args(data_dir, tmp_path, *unguarded), fault) == 137
    path = tmp_path / SCALARS
    header, *rounds = path.read_text().splitlines(keepends=True)
    config = load_config(QUICKSTART, sets(data_dir, *DIVERGING))
    made_before = json.loads(header)
    made_before["config"]["guard_factor"] = config.guard_factor
    path.write_text(json.dumps(made_before) + "\n" + "".join(rounds))
    exp = build(config)
    with pytest.raises(ValueError, match=r"goes on to round 100, but the divergence guard stops"):
        resume_from_scalars(
            tmp_path, config, exp.algorithm, untrained_hash(exp.algorithm), exp.data_identity
        )
