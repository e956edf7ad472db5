"""A run hands its model out and is a ledger: the exported model reloads with transformers and
gives the run's logits, `seedflood replay` rebuilds the model from the message log alone and
ends on the run's hash, `seedflood evaluate` scores the export as the run did, and the divergence
guard stops a run made to diverge at one step that the replay reproduces."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import load_config
from seedflood.learning.models import save_model
from seedflood.protocol.ledger import LOG, MANIFEST, LedgerError
from seedflood.protocol.message_log import read_messages, write_messages
from seedflood.protocol.messages import Message
from seedflood.sim.checkpoint import (
    CHECKPOINT_NAME,
    KILL_AT_VARIABLE,
    KILL_ROUND_VARIABLE,
    CheckpointError,
)
from seedflood.sim.ledger import IN_FLIGHT, LAST_ROUND, ledger_ahead, resume_from_ledger
from seedflood.sim.replay import replay
from seedflood.sim.runner import build, run
from tests.forked import seedflood_in_child

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


SETTINGS = (
    "model=tiny",
    "clients=4",
    "rounds=6",
    "eval_every=3",
    "rank=8",
    "batch_size=4",
    "n_train=64",
    "n_val=16",
    "n_test=40",
)


def config(data_dir: Path, *extra: str):
    return load_config(QUICKSTART, [*SETTINGS, f"data_dir={data_dir}", *extra])


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[1, 17, 230, 4012, 99, 5], [7, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        return model(ids).logits


def test_the_exported_model_reloads_with_the_runs_logits(data_dir, tmp_path, one_thread) -> None:
    run_config = config(data_dir, "hops=1", "clients=8")  # hops 1: clients differ at the end
    exp = build(run_config)
    for round_index in range(run_config.rounds):
        exp.algorithm.run_round(round_index)
    with exp.algorithm.global_view():
        expected = logits(exp.algorithm.model)
        save_model(exp.algorithm.model, exp.tokenizer, tmp_path / "model")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert torch.equal(logits(reloaded), expected)


SCHEDULED = ["method=seedflood", "lr_schedule=cosine", "warmup_ratio=0.3", "eps_schedule=cosine"]


@pytest.mark.parametrize(
    "variant", [["method=seedflood"], ["method=seedflood", "clip_multiple=3"], SCHEDULED]
)
@pytest.mark.slow
def test_replay_of_a_simulated_run_ends_on_its_hash(
    variant, data_dir, tmp_path, one_thread
) -> None:
    results = run(config(data_dir, *variant), tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["messages"] == results["ledger_messages"] == 4 * 6
    assert results["ledger_bytes"] == (tmp_path / LOG).stat().st_size < 200
    assert results["model_bytes"] > 1000 * results["ledger_bytes"]
    done = replay(tmp_path, tmp_path / "replayed")
    assert done["state_hash"] == results["state_hash"] == manifest["state_hash"]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    rebuilt = AutoModelForCausalLM.from_pretrained(tmp_path / "replayed")
    assert torch.equal(logits(exported), logits(rebuilt))


def test_a_ledger_that_does_not_match_is_refused_by_name(data_dir, tmp_path, one_thread) -> None:
    run(config(data_dir), tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    wrong = copy.deepcopy(manifest)
    wrong["update"]["lr"] *= 2
    (tmp_path / MANIFEST).write_text(json.dumps(wrong))
    with pytest.raises(LedgerError, match=r"ends on .* not on the run's"):
        replay(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "messages": 3}))
    with pytest.raises(LedgerError, match="holds 24 messages, but the manifest counts 3"):
        replay(tmp_path)
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "nowhere")])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "not found: a SeedFlood run directory" in output


@pytest.mark.slow
def test_evaluate_scores_the_export_as_the_run_did(data_dir, tmp_path, one_thread) -> None:
    results = run(config(data_dir), tmp_path)
    args = ["evaluate", str(tmp_path / "model"), "--task", "sst2"]
    for override in (f"data_dir={data_dir}", "n_train=64", "n_val=16", "n_test=40"):
        args += ["--set", override]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    scored = f"test accuracy {results['accuracy']:.4f}, loss {results['eval_loss']:.4f}"
    assert f"{scored} on 40 sst2 examples" in output


def test_gossip_runs_export_their_model_and_lora_its_adapter(
    data_dir, tmp_path, one_thread
) -> None:
    results = run(config(data_dir, "method=dsgd", "lora=true", "lr=0.5"), tmp_path)
    assert results["model_dir"] == "model" and "ledger_messages" not in results
    assert (tmp_path / "model" / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert not any("lora" in name for name, _ in merged.named_parameters())


@pytest.mark.slow
def test_a_rate_far_too_high_trips_the_guard_and_the_replay_agrees(
    data_dir, tmp_path, one_thread
) -> None:
    results = run(
        config(data_dir, "lr=30", "rounds=200", "eval_every=100", "guard_warmup=10"), tmp_path
    )
    guard = results["guard"]
    assert guard["action"] == "stopped" and 10 <= guard["step"] < 200
    assert guard["rule"] == "spike" and guard["value"] > guard["factor"] * guard["reference"]
    # The run ends on the model of the step before: every client committed the same steps.
    assert results["committed_step"] == guard["step"] - 1
    assert results["ledger_messages"] == 4 * guard["step"]
    assert replay(tmp_path)["state_hash"] == results["state_hash"]
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert history[-1]["round"] == guard["step"] + 1


@pytest.mark.slow
@pytest.mark.parametrize("removed", [(), (CHECKPOINT_NAME,)])
def test_a_run_the_guard_stopped_stays_stopped_when_resumed(
    data_dir, tmp_path, one_thread, removed
) -> None:
    """Killed after the evaluation of the round it stopped at, before its results: resumed from
    the checkpoint or the ledger, it ends there as the uninterrupted run did, not a round on."""
    sets = [*SETTINGS, f"data_dir={data_dir}", "lr=30", "rounds=200", "eval_every=100"]
    sets.append("guard_warmup=10")
    whole = run(load_config(QUICKSTART, sets), tmp_path / "whole")
    stopped_at = whole["guard"]["step"] + 1  # one step a round
    cut = tmp_path / "cut"
    args = ["run", str(QUICKSTART), "--out", str(cut), "--resume"]
    for override in sets:
        args += ["--set", override]
    fault = {KILL_ROUND_VARIABLE: str(stopped_at), KILL_AT_VARIABLE: "checkpoint"}
    assert seedflood_in_child(args, fault) == 137
    for name in removed:
        (cut / name).unlink()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    resumed = json.loads((cut / "results.json").read_text())
    timing = {"wall_seconds", "train_seconds", "peak_rss_mb", "peak_device_mb"}
    assert resumed["ledger_messages"] == whole["ledger_messages"] == 4 * whole["guard"]["step"]
    assert {k: v for k, v in resumed.items() if k not in timing} == {
        k: v for k, v in json.loads(json.dumps(whole)).items() if k not in timing
    }


@pytest.mark.slow
def test_the_guard_is_on_by_default_and_quiet_on_a_sane_run(data_dir, tmp_path, one_thread) -> None:
    results = run(config(data_dir, "rounds=40", "eval_every=40", "guard_warmup=10"), tmp_path)
    assert results["guard"] == {"action": "none"} and results["committed_step"] == 39
    off = run(config(data_dir, "guard_factor=null"), tmp_path / "off")
    assert off["guard"] == {"action": "off"}


def test_scalars_beyond_fp16_saturate_and_are_counted(data_dir, tmp_path, one_thread) -> None:
    args = ["run", str(QUICKSTART), "--out", str(tmp_path)]
    for override in (
        "model=tiny",
        f"data_dir={data_dir}",
        "clients=4",
        "rounds=2",
        "n_train=64",
        "n_val=16",
        "n_test=16",
        "attackers=1",
        "attack_factor=1e9",
        "scalar_format=fp16",
        "guard_factor=null",
    ):
        args += ["--set", override]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["saturated_scalars"] == 2  # the attacker's message of each round
    assert replay(tmp_path)["state_hash"] == results["state_hash"]


def test_seeds_beyond_63_bits_are_refused_by_name(data_dir, tmp_path) -> None:
    args = ["run", str(QUICKSTART), "--set", "model=tiny", "--set", f"seed={2**63}"]
    result = CliRunner().invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "seed" in output and "less than 9223372036854775808" in output


@pytest.mark.slow  # a run, then its resume from the ledger (about 5 s each)
@pytest.mark.parametrize(
    ("flooding", "kill_round", "kill_at", "removed", "resumed_at"),
    [
        # killed in round 8, between evaluations (every 3 rounds): back to round 7, logged whole
        ((), "8", "round", (CHECKPOINT_NAME,), 7),
        # delayed: hops 1 on an 8-client ring (diameter 4), messages in flight every round
        (("clients=8", "hops=1"), "8", "round", (CHECKPOINT_NAME,), 7),
        # the checkpoint of round 6 kept: the ledger, a round further, is preferred
        (("clients=8", "hops=1"), "8", "round", (), 7),
        # killed before round 6's evaluation: back to round 5, so that round 6 is evaluated
        (("clients=8", "hops=1"), "6", "round", (CHECKPOINT_NAME,), 5),
        # killed after round 6's history, before its checkpoint and round file: history's round
        (("clients=8", "hops=1"), "6", "history", (CHECKPOINT_NAME,), 6),
        # the same with round 3's checkpoint kept: the ledger, at history's round, is preferred
        (("clients=8", "hops=1"), "6", "history", (), 6),
        # ledger_round.json lost (or a ledger written before it existed): the last evaluation
        (("clients=8", "hops=1"), "8", "round", (CHECKPOINT_NAME, LAST_ROUND), 6),
    ],
)
def test_a_killed_run_resumes_from_its_ledger(
    data_dir, tmp_path, one_thread, flooding, kill_round, kill_at, removed, resumed_at
) -> None:
    """Killed with its checkpoint gone (or older than the ledger): the log, the messages in
    flight, ledger_round.json and history.jsonl bring it back to the last round they hold with
    no forward pass, and it ends as an uninterrupted run does."""
    sets = [*SETTINGS, f"data_dir={data_dir}", "rounds=9", *flooding]
    whole = run(load_config(QUICKSTART, sets), tmp_path / "whole")
    cut = tmp_path / "cut"
    args = ["run", str(QUICKSTART), "--out", str(cut), "--resume"]
    for override in sets:
        args += ["--set", override]
    fault = {KILL_ROUND_VARIABLE: kill_round, KILL_AT_VARIABLE: kill_at}
    assert seedflood_in_child(args, fault) == 137
    assert (cut / IN_FLIGHT).is_file() == bool(flooding)
    assert json.loads((cut / LAST_ROUND).read_text())["round"] == int(kill_round) - 1
    for name in removed:
        (cut / name).unlink()
    other = CliRunner().invoke(app, [*args, "--set", "lr=0.02"])  # not this log's run
    assert other.exit_code == 2
    assert "lr (checkpoint 0.005, now 0.02)" in " ".join(other.output.split())
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"resumed from the ledger at round {resumed_at}" in " ".join(result.output.split())
    resumed = json.loads((cut / "results.json").read_text())
    timing = {"wall_seconds", "train_seconds", "peak_rss_mb", "peak_device_mb"}
    assert {k: v for k, v in resumed.items() if k not in timing} == {
        k: v for k, v in json.loads(json.dumps(whole)).items() if k not in timing
    }
    history = [line for line in (cut / "history.jsonl").read_text().splitlines()]
    assert [json.loads(line)["round"] for line in history] == [0, 3, 6, 9]
    assert (cut / LOG).read_bytes() == (tmp_path / "whole" / LOG).read_bytes()
    assert not (cut / IN_FLIGHT).exists() and not (cut / LAST_ROUND).exists()
    if flooding:  # messages were still in flight when the run ended: never committed, not logged
        assert whole["ledger_messages"] < 8 * 9


def resume_from(out: Path, run_config):
    exp = build(run_config)
    return resume_from_ledger(out, run_config, exp.algorithm, exp.data_identity)


def test_the_ledger_is_taken_over_a_checkpoint_only_where_it_reaches_further(tmp_path) -> None:
    """It reaches the later of its round file and history's last evaluation (written before the
    checkpoint): a checkpoint as far along is read instead, and one whose round is unknown is
    left for loading to refuse."""
    (tmp_path / "history.jsonl").write_text('{"round": 0}\n{"round": 6}\n')
    assert not ledger_ahead(tmp_path, 3)  # no round file: no ledger to take
    (tmp_path / LAST_ROUND).write_text('{"round": 5, "train_seconds": 1, "wall_seconds": 2}')
    assert [ledger_ahead(tmp_path, done) for done in (3, 5, 6, None)] == [
        True,
        True,
        False,
        False,
    ]
    (tmp_path / LAST_ROUND).write_text('{"round": 8, "train_seconds": 1, "wall_seconds": 2}')
    assert [ledger_ahead(tmp_path, done) for done in (6, 8)] == [True, False]


def test_a_ledger_made_on_other_data_is_refused(data_dir, tmp_path, one_thread) -> None:
    """The same config on edited data files draws other examples: a finished run's ledger
    replayed there would pass its model off as trained on them (compare reruns such a run)."""
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    out = tmp_path / "run"
    sets = [*SETTINGS, f"data_dir={data}", "rounds=2", "eval_every=2"]
    run(load_config(QUICKSTART, sets), out)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["data"]["train"] == 64 and len(manifest["data"]["sha256"]) == 64
    (out / "results.json").unlink()
    rows = (data / "sst2" / "train.jsonl").read_text().splitlines()
    (data / "sst2" / "train.jsonl").write_text("\n".join(rows[1:]) + "\n")  # one row fewer
    args = ["run", str(QUICKSTART), "--out", str(out), "--resume"]
    for override in sets:
        args += ["--set", override]
    result = CliRunner().invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "was written by a run on other data (then 64 train" in output
    assert "the data files changed since; run it again without --resume" in output


def test_a_damaged_round_file_is_refused_by_name(data_dir, tmp_path, one_thread) -> None:
    out = tmp_path / "run"
    sets = [*SETTINGS, f"data_dir={data_dir}", "rounds=2", "eval_every=2"]
    run_config = load_config(QUICKSTART, sets)
    run(run_config, out)
    (out / "results.json").unlink()
    for damage in ('{"round": "7"}', "{", '{"round": 1, "train_seconds": 2.0}'):
        (out / LAST_ROUND).write_text(damage)
        with pytest.raises(CheckpointError, match=r"ledger_round.json is damaged: it must hold"):
            resume_from(out, run_config)


def test_files_from_two_runs_are_refused_not_mixed(data_dir, tmp_path, one_thread) -> None:
    """A log and an in-flight file that disagree on a message are from different runs."""
    out = tmp_path / "run"
    sets = [*SETTINGS, f"data_dir={data_dir}", "clients=8", "hops=1"]
    run_config = load_config(QUICKSTART, sets)
    run(run_config, out)
    history = out / "history.jsonl"
    messages = read_messages(out / LOG)
    first = messages[0]
    write_messages(out / IN_FLIGHT, [Message(first.step, first.origin, first.scalar + 1.0)])
    (out / "results.json").unlink()
    with pytest.raises(CheckpointError, match=r"disagree on message \(0, 0\)"):
        resume_from(out, run_config)
    write_messages(out / IN_FLIGHT, [Message(first.step, 8, first.scalar)])
    with pytest.raises(CheckpointError, match=r"message from client 8, but the run has 8 clients"):
        resume_from(out, run_config)
    (out / IN_FLIGHT).unlink()
    history.write_text(history.read_text().splitlines()[0] + "\n" + '{"round": 99}\n')
    with pytest.raises(CheckpointError, match="the ledger was cut"):
        resume_from(out, run_config)


@pytest.mark.slow
def test_a_run_in_progress_is_reported_with_its_curve(data_dir, tmp_path, one_thread) -> None:
    run(config(data_dir), tmp_path)
    (tmp_path / "results.json").unlink()  # as a run killed after its last evaluation leaves it
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "report.md").read_text()
    assert "in progress" in report and "| 6 |" in report and "s per round" in report
    assert (tmp_path / "progress.png").stat().st_size > 10_000
