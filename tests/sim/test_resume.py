"""A run killed at any point and resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import ConfigError, RunConfig, load_config
from seedflood.files import read_jsonl
from seedflood.sim.checkpoint import (
    CHECKPOINT_NAME,
    KILL_AT_VARIABLE,
    KILL_ROUND_VARIABLE,
    Progress,
    load_checkpoint,
    save_checkpoint,
)
from seedflood.sim.devices import peak_rss_mb, proc_status_kb, reset_peak_rss
from seedflood.sim.replay import replay
from seedflood.sim.runner import build, run
from tests.forked import seedflood_in_child

ROUNDS, EVAL_EVERY = 9, 3
TIMING = {"wall_seconds", "train_seconds", "peak_rss_mb", "peak_device_mb"}
METHODS = {
    # hops = 1 on a ring of 8 leaves messages pending across rounds: flood states, outboxes and
    # the pending table all have to come back from the checkpoint.
    "seedflood": ["method=seedflood", "hops=1"],
    # Lossy links add per-edge generators, delayed packets and anti-entropy counters.
    "seedflood-lossy": [
        "method=seedflood",
        "hops=1",
        "link_loss=0.2",
        "link_duplicate=0.1",
        "link_reorder=0.2",
        "link_delay=0.2",
        "link_delay_hops=2",
    ],
    "dsgd": ["method=dsgd"],
    # Its scalar ledger may be ahead of its checkpoint: the resume takes the later of the two.
    "dzsgd-lora": ["method=dzsgd", "lora=true"],
}


def overrides(data_dir: Path, method: str) -> list[str]:
    return [
        "model=tiny",
        f"data_dir={data_dir}",
        "clients=8",
        "topology=ring",
        f"rounds={ROUNDS}",
        f"eval_every={EVAL_EVERY}",
        "rank=16",
        "batch_size=2",
        "n_train=64",
        "n_val=16",
        "n_test=24",
        *METHODS[method],
    ]


def config_of(data_dir: Path, method: str, *extra: str) -> RunConfig:
    return load_config("configs/quickstart.yaml", [*overrides(data_dir, method), *extra])


def cli_args(data_dir: Path, method: str, out: Path) -> list[str]:
    args = ["run", "configs/quickstart.yaml", "--out", str(out)]
    for override in overrides(data_dir, method):
        args += ["--set", override]
    return args


def without_timing(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in TIMING}


def killed_run(data_dir: Path, method: str, out: Path, kill_round: int, point: str) -> int:
    """`seedflood run --resume` in a child process told to die after ``kill_round``; its exit
    status."""
    fault = {KILL_ROUND_VARIABLE: str(kill_round), KILL_AT_VARIABLE: point}
    return seedflood_in_child([*cli_args(data_dir, method, out), "--resume"], fault)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def uninterrupted(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[dict, list[dict]]]:
    finished = {}
    for method in METHODS:
        out = tmp_path_factory.mktemp(f"whole-{method}")
        results = run(config_of(data_dir, method), out)
        assert not (out / CHECKPOINT_NAME).exists(), "a finished run keeps no checkpoint"
        finished[method] = (results, read_jsonl(out / "history.jsonl"))
    return finished


@pytest.mark.slow  # twelve real `seedflood run` processes killed mid-run and resumed
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("point", ["round", "history", "checkpoint"])
def test_killed_and_resumed_equals_uninterrupted(
    method: str,
    point: str,
    data_dir: Path,
    tmp_path: Path,
    uninterrupted: dict[str, tuple[dict, list[dict]]],
) -> None:
    """Killed twice, after two drawn rounds (the second time while resuming), then resumed: each
    time before anything is written (between checkpoints when the round is not an evaluation),
    between the history file and the checkpoint, or after both."""
    draw = random.Random(f"{method}-{point}")
    # The history point exists only at evaluation rounds; the last round's checkpoint is the
    # last moment before results.json.
    choices = (
        range(EVAL_EVERY, ROUNDS + 1, EVAL_EVERY) if point == "history" else range(1, ROUNDS + 1)
    )
    for kill_round in sorted(draw.sample(choices, 2)):
        assert killed_run(data_dir, method, tmp_path, kill_round, point) == 137
        assert not (tmp_path / "results.json").exists()
        history = read_jsonl(tmp_path / "history.jsonl")
        written = kill_round if point != "round" else kill_round - 1
        assert history[-1]["round"] == written - written % EVAL_EVERY
        assert (tmp_path / CHECKPOINT_NAME).is_file()

    result = CliRunner().invoke(app, [*cli_args(data_dir, method, tmp_path), "--resume"])
    assert result.exit_code == 0, result.output
    assert "resumed from" in result.output
    expected_results, expected_history = uninterrupted[method]
    results = json.loads((tmp_path / "results.json").read_text())
    assert without_timing(results) == without_timing(json.loads(json.dumps(expected_results)))
    assert len(results["state_hash"]) == 64
    resumed_history = read_jsonl(tmp_path / "history.jsonl")
    assert [without_timing(r) for r in resumed_history] == [
        without_timing(r) for r in expected_history
    ]
    assert [r["round"] for r in resumed_history] == [0, 3, 6, 9]
    if method.startswith("seedflood"):  # the ledger was cut back to each checkpoint, and holds
        assert replay(tmp_path)["state_hash"] == results["state_hash"]  # exactly the run
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_resume_refuses_another_config_naming_the_keys(data_dir: Path, tmp_path: Path) -> None:
    assert killed_run(data_dir, "seedflood", tmp_path, 4, "round") == 137
    other = config_of(data_dir, "seedflood", "lr=0.02", "eps=0.01")
    with pytest.raises(ConfigError) as refused:
        run(other, tmp_path, resume=True)
    message = str(refused.value)
    assert "lr (checkpoint 0.005, now 0.02)" in message
    assert "eps (checkpoint 0.001, now 0.01)" in message
    assert "batch_size" not in message
    assert (tmp_path / CHECKPOINT_NAME).is_file(), "a refused resume keeps the checkpoint"


def test_resume_refuses_a_checkpoint_made_on_other_data(data_dir: Path, tmp_path: Path) -> None:
    """The same config on edited data files draws other examples: resuming would go on training
    the checkpoint's model on them under the old history."""
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    assert killed_run(data, "dsgd", tmp_path / "run", 4, "round") == 137
    train = data / "sst2" / "train.jsonl"
    train.write_text("".join(train.read_text().splitlines(keepends=True)[1:]))  # one row fewer
    with pytest.raises(ConfigError, match=r"on other data \(then 64 train, 16 val, 24 test"):
        run(config_of(data, "dsgd"), tmp_path / "run", resume=True)
    assert (tmp_path / "run" / CHECKPOINT_NAME).is_file(), "a refused resume keeps the checkpoint"


@pytest.mark.slow
def test_resume_without_checkpoint_starts_from_scratch(
    data_dir: Path, tmp_path: Path, uninterrupted: dict[str, tuple[dict, list[dict]]]
) -> None:
    notes: list[str] = []
    results = run(
        config_of(data_dir, "dsgd"),
        tmp_path,
        lambda _done, record: notes.append(record.get("text", "")),
        resume=True,
    )
    assert f"no checkpoint {tmp_path / CHECKPOINT_NAME}: starting from scratch" in notes
    assert without_timing(results) == without_timing(uninterrupted["dsgd"][0])


@pytest.mark.parametrize(
    "failure",
    [OSError(28, "No space left on device"), RuntimeError("unexpected pos 57472 vs 57366")],
)
@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_leaves_the_run_going(
    data_dir: Path,
    tmp_path: Path,
    uninterrupted: dict[str, tuple[dict, list[dict]]],
    monkeypatch: pytest.MonkeyPatch,
    failure: Exception,
) -> None:
    """A full disk (as the OS or as torch's writer reports it) costs the checkpoint, which only a
    resume needs, never the run: it ends as an uninterrupted one and says what was not saved."""

    def full_disk(*_args: object) -> None:
        raise failure

    monkeypatch.setattr("seedflood.sim.runner.save_checkpoint", full_disk)
    notes: list[str] = []
    results = run(
        config_of(data_dir, "dsgd"), tmp_path, lambda _d, r: notes.append(r.get("text", ""))
    )
    assert without_timing(results) == without_timing(uninterrupted["dsgd"][0])
    unsaved = [note for note in notes if note.startswith("checkpoint not written")]
    assert len(unsaved) == ROUNDS // EVAL_EVERY + 1  # every evaluation, round 0's included
    assert unsaved[1].startswith(f"checkpoint not written at round {EVAL_EVERY} ({failure}; ")
    assert "MB free on its disk): the run goes on" in unsaved[1]


def test_state_added_to_an_algorithm_is_saved_without_being_declared(
    data_dir: Path, tmp_path: Path
) -> None:
    """What other features add to an algorithm object (a link's generator, a clip window, a cut
    graph, a helper holding the model) comes back; references to the model point at the new
    build's, and values shared between attributes stay shared."""
    config = config_of(data_dir, "seedflood")
    algorithm = build(config).algorithm
    algorithm.run_round(0)
    algorithm.link_rng = random.Random(7)
    algorithm.link_rng.random()
    algorithm.clip_window = [0.5, 0.25]
    algorithm.cut = {"topology": algorithm.topology, "edges": [(0, 1)]}
    algorithm.helper = {"model": algorithm.model, "first": next(algorithm.model.parameters())}
    progress = Progress(1, [{"round": 1}], 0.5, 0.75, 0.5)
    save_checkpoint(tmp_path / CHECKPOINT_NAME, config, progress, algorithm)

    fresh = build(config).algorithm
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME, config, fresh) == progress
    assert fresh.link_rng.random() == algorithm.link_rng.random()
    assert fresh.clip_window == [0.5, 0.25]
    assert fresh.cut["topology"] is fresh.topology
    assert fresh.helper["model"] is fresh.model
    assert fresh.helper["first"] is next(fresh.model.parameters())
    assert fresh.pending == algorithm.pending and fresh.pending
    assert fresh.network.traffic is fresh.network.counter.traffic
    assert fresh.network.summary() == algorithm.network.summary()
    assert fresh.run_round(1) == algorithm.run_round(1)


@pytest.mark.slow
def test_resuming_copies_the_saved_state_into_the_build_and_leaves_the_file_alone(
    data_dir: Path, tmp_path: Path
) -> None:
    """The saved models land in the fresh build's own storage (one copy of the state in memory,
    not two), views of them stay views, and the file is not read again: overwriting it in place
    afterwards changes nothing."""
    config = config_of(data_dir, "dsgd")
    algorithm = build(config).algorithm
    algorithm.run_round(0)
    algorithm.second_row = algorithm.x[1]
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, config, Progress(1, [{"round": 1}], 0.5, 0.75, 0.5), algorithm)

    fresh = build(config).algorithm
    built_at = fresh.x.data_ptr()
    load_checkpoint(path, config, fresh)
    assert fresh.x.data_ptr() == built_at
    assert fresh.second_row.data_ptr() == fresh.x[1].data_ptr()
    with path.open("r+b") as file:
        file.write(bytes(path.stat().st_size))
    assert torch.equal(fresh.x, algorithm.x)
    assert torch.equal(fresh.second_row, algorithm.x[1])
    assert fresh.run_round(1) == algorithm.run_round(1)
    assert torch.equal(fresh.x, algorithm.x)


@pytest.mark.skipif(
    not reset_peak_rss(),
    reason="this system cannot reset a process's peak memory (/proc/self/clear_refs)",
)
@pytest.mark.slow
def test_a_run_reports_its_own_peak_memory_not_the_processs(data_dir: Path, tmp_path: Path) -> None:
    """``compare`` runs a grid in one process: a run's peak must not count what an earlier run
    (or a resume's read of its checkpoint) held."""
    held = torch.ones(2**29)  # 2 GiB, written, so resident
    process_peak = peak_rss_mb()
    del held
    results = run(config_of(data_dir, "dsgd"), tmp_path)
    assert results["peak_rss_mb"] < process_peak - 1024


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="this system has no /proc")
def test_proc_status_reads_a_processs_memory_and_none_once_it_is_gone() -> None:
    """benchmarks/resume_memory.py samples a child until it exits: a reaped child reads None.
    The child holds 256 MiB it wrote (so resident); this process's own heap may reuse freed
    memory, so its growth says nothing."""
    holding = "import time; held = b'x' * (1 << 28); print('ready', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", holding], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert proc_status_kb("RssAnon", child.pid) > 200 * 1024  # type: ignore[operator]
        assert proc_status_kb("NoSuchField", child.pid) is None
    finally:
        child.kill()
        child.wait()
    assert proc_status_kb("RssAnon", child.pid) is None


def test_bad_kill_request_is_refused(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KILL_ROUND_VARIABLE, "3")
    monkeypatch.setenv(KILL_AT_VARIABLE, "midway")
    with pytest.raises(ConfigError, match="one of round, history, checkpoint"):
        run(config_of(data_dir, "dsgd"), tmp_path)


@pytest.mark.slow  # a real `seedflood compare` process killed mid-run
def test_compare_resumes_an_interrupted_run_where_it_stopped(
    data_dir: Path, tmp_path: Path, uninterrupted: dict[str, tuple[dict, list[dict]]]
) -> None:
    settings = ", ".join(
        override.replace("=", ": ") for override in overrides(data_dir, "seedflood")
    )
    grid = tmp_path / "grid.yaml"
    base = Path("configs/quickstart.yaml").resolve()
    grid.write_text(f"base: {base}\ncommon: {{{settings}}}\nvariants:\n  seedflood: {{}}\n")
    out = tmp_path / "out"
    killed = seedflood_in_child(
        ["compare", str(grid), "--out", str(out)], {KILL_ROUND_VARIABLE: "5"}
    )
    assert killed == 137

    result = CliRunner().invoke(app, ["compare", str(grid), "--out", str(out)])
    assert result.exit_code == 0, result.output
    # Killed in round 5: its ledger has round 4 whole, a round beyond round 3's checkpoint.
    output = " ".join(result.output.split())
    assert "seedflood: resumed from the ledger at round 4" in output
    # the lane's log says the replay has begun: a long one takes minutes without a forward pass
    assert "seedflood: replaying the ledger: round 1 of 4 (no forward pass)" in output
    results = json.loads((out / "runs" / "seedflood" / "results.json").read_text())
    expected = json.loads(json.dumps(uninterrupted["seedflood"][0]))
    differing = {k for k in results.keys() | expected.keys() if results.get(k) != expected.get(k)}
    # The grid labels its run; nothing measured differs.
    assert differing - TIMING == {"config"}
    assert {**results["config"], "label": None} == {**expected["config"], "label": None}
    assert results["state_hash"] == expected["state_hash"]


@pytest.mark.slow  # two runs per gossip method (about 10 s)
@pytest.mark.parametrize("method", ["choco", "dzsgd"])
def test_evaluation_settings_leave_the_trained_state_untouched(
    data_dir: Path, tmp_path: Path, method: str
) -> None:
    """Paper grids reuse a finished run whose evaluation settings differ from theirs; that is
    sound only if evaluating never changes what is trained."""
    finished = [
        run(
            config_of(
                data_dir,
                "dsgd",
                f"method={method}",
                "rounds=3",
                f"eval_every={every}",
                f"eval_clients={k}",
            ),
            tmp_path / f"every-{every}",
        )
        for every, k in ((1, 4), (3, 2))
    ]
    assert finished[0]["state_hash"] == finished[1]["state_hash"]
    assert finished[0]["accuracy"] == finished[1]["accuracy"]
    assert finished[0]["consensus_distance"] > 0  # the clients differ: evaluation reads each
