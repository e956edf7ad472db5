"""Run n clients in one process: the loop every method shares.

config → model + task → clients → algorithm rounds → evaluation → results files. The algorithm
object owns what differs between methods (local steps, messages, transport); this loop only
schedules rounds and evaluations and writes what it measured.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from seedflood import __version__
from seedflood.algorithms.attacks import PoisoningSeedFlood
from seedflood.algorithms.common import Algorithm
from seedflood.algorithms.gossip import Gossip, gossip_memory_bytes
from seedflood.algorithms.seedflood import SeedFlood
from seedflood.build import Parts, build_parts, on_device, run_direction, run_precision
from seedflood.config import ConfigError, RunConfig
from seedflood.files import atomic_write_json, atomic_write_jsonl, remove_stale_temporaries
from seedflood.learning.accuracy_cache import cached_accuracy
from seedflood.learning.generation import greedy_generations
from seedflood.learning.models import add_lora, save_model, state_hash
from seedflood.learning.schedules import eps_schedule, lr_schedule
from seedflood.learning.scoring import TokenizedExample, accuracy, evaluation, majority_rate
from seedflood.learning.tasks import TaskSpec
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.guard import DivergenceGuard
from seedflood.sim.checkpoint import (
    CheckpointDamaged,
    Progress,
    checkpoint_path,
    checkpoint_round,
    checkpoints_wanted,
    kill_point,
    load_checkpoint,
    maybe_kill,
    save_checkpoint,
)
from seedflood.sim.devices import (
    available_bytes,
    draw_threads,
    peak_device_mb,
    peak_rss_mb,
    reset_peak_rss,
    run_device,
)
from seedflood.sim.faults import LinkFaults, simulated_links
from seedflood.sim.ledger import LedgerPoint, ledger_ahead, mark_round
from seedflood.sim.run_ledgers import (
    continues_a_checkpoint,
    open_ledger,
    replayable,
    resume_from_ledgers,
    untrained_hash,
)
from seedflood.sim.tracking import Tracker
from seedflood.topology import Topology

ProgressCallback = Callable[[int, dict[str, Any]], None]


@dataclass
class Experiment:
    """Everything a run is built from, before its first step."""

    config: RunConfig
    topology: Topology
    algorithm: Algorithm
    tokenizer: PreTrainedTokenizerBase
    val: list[TokenizedExample]
    test: list[TokenizedExample]
    pad_id: int
    data_notes: list[str]
    data_source: str
    data_identity: dict[str, int | str]
    parameters: int


def check_memory(config: RunConfig, trainable: int, device: torch.device) -> None:
    """Refuse before the first step a run that would not fit in ``device``'s free memory (the
    estimate is the measured peak, so a run that fits alone is not refused for a margin)."""
    if config.method == "seedflood":
        return
    # the threads' buffers are the CPU's whatever the device: a GPU's memory holds none
    drawing = config.method == "dzsgd" and not config.batched_forward and device.type == "cpu"
    needed = gossip_memory_bytes(
        config.clients,
        trainable,
        config.method == "choco",
        config.batched_forward,
        draw_workers=draw_threads() if drawing else 0,
    )
    available = available_bytes(device)
    if needed > available:
        copies = "2 × " if config.method == "choco" else ""
        raise ConfigError(
            f"method {config.method} with {config.clients} clients keeps {copies}"
            f"{config.clients} × {trainable:,} fp32 values and working space: about "
            f"{needed / 1e9:.1f} GB, but only {available / 1e9:.1f} GB of {device.type} memory "
            "is available; use lora: true, fewer clients or "
            "a smaller model"
        )


def build_algorithm(config: RunConfig, parts: Parts) -> Algorithm:
    """The method the config names over the built parts, handed the simulated links it talks
    over: the algorithm never builds its own transport."""
    model, topology = parts.model, parts.topology
    common = {
        "model": model,
        "topology": topology,
        "shards": [parts.shard(c) for c in range(config.clients)],
        "pad_id": parts.pad_id,
        "lr": lr_schedule(config),
        "eps": eps_schedule(config),
        "batch_size": config.batch_size,
        "local_steps": config.steps_per_round,
        "run_seed": config.seed,
    }
    if config.method == "seedflood":
        hops = config.hops or topology.diameter
        network, repair = simulated_links(
            topology,
            LinkFaults.from_config(config, topology),
            scalar_format=config.scalar_format,
            local_steps=config.steps_per_round,
            hops=hops,
        )
        if config.attackers:
            common = {**common, "attackers": config.attackers, "factor": config.attack_factor}
        flooding = PoisoningSeedFlood if config.attackers else SeedFlood
        return flooding(
            direction=run_direction(config, model),
            hops=hops,
            scalar_format=config.scalar_format,
            batched=config.batched_forward,
            network=network,
            repair=repair,
            repair_exchanges=config.repair_exchanges,
            clip=ScalarClip.from_config(config),
            guard=DivergenceGuard.from_config(config),
            **common,
        )
    if config.lora:
        trainable = add_lora(
            model,
            rank=config.lora_rank,
            alpha=config.lora_alpha,
            targets=config.lora_targets,
            seed=config.seed,
        )
    else:
        trainable = list(model.parameters())
    check_memory(config, sum(p.numel() for p in trainable), next(model.parameters()).device)
    return Gossip(
        trainable=trainable,
        estimator="zo" if config.method == "dzsgd" else "gradient",
        mixing=config.mixing,
        topk_ratio=config.topk_ratio if config.method == "choco" else None,
        gamma=config.gamma,
        batched=config.batched_forward,
        draw_workers=draw_threads(),
        guard=DivergenceGuard.from_config(config) if config.method == "dzsgd" else None,
        **common,
    )


def build(config: RunConfig, device: torch.device | None = None) -> Experiment:
    """The run's parts and its algorithm, its model on ``device`` (the CPU by default); call it
    inside ``with on_device(device):`` so that the tensors methods create land there too."""
    parts = build_parts(config, device)
    parameters = parts.parameters  # before LoRA adds its adapters
    return Experiment(
        config=config,
        topology=parts.topology,
        algorithm=build_algorithm(config, parts),
        tokenizer=parts.tokenizer,
        val=parts.val,
        test=parts.test,
        pad_id=parts.pad_id,
        data_notes=parts.data_notes,
        data_source=parts.data_source,
        data_identity=parts.data_identity,
        parameters=parameters,
    )


def evaluate(exp: Experiment, examples: list[TokenizedExample]) -> dict[str, float]:
    """GMP accuracy and loss (language modelling: exact greedy completions, and perplexity),
    and the clients' own accuracy where their models differ from it."""
    algorithm, batch_size = exp.algorithm, exp.config.eval_batch_size
    with algorithm.global_view():
        scored = evaluation(algorithm.model, examples, exp.pad_id, batch_size)
    global_accuracy = scored.accuracy
    if algorithm.clients_identical():
        client_accuracies = [global_accuracy]
    else:
        n, k = algorithm.n, min(exp.config.eval_clients, algorithm.n)
        client_accuracies = []
        for client in sorted({i * n // k for i in range(k)}):
            with algorithm.client_view(client):
                client_accuracies.append(
                    accuracy(algorithm.model, examples, exp.pad_id, batch_size)
                )
    language_model = {} if scored.perplexity is None else {"perplexity": scored.perplexity}
    return {
        "accuracy": global_accuracy,
        "eval_loss": scored.loss,
        **language_model,
        "client_accuracy_mean": sum(client_accuracies) / len(client_accuracies),
        "client_accuracy_min": min(client_accuracies),
        "consensus_distance": algorithm.consensus_distance(),
    }


def _unsaved(saved_at: Path, done: int, error: BaseException) -> str:
    """Why a checkpoint was not written. Training goes on: a checkpoint is only what a resume
    starts from, and first-order runs on a lent GPU filled its disk with 8.6 GB checkpoints and
    died at their first evaluation, where they would have finished without one."""
    free_mb = shutil.disk_usage(saved_at.parent).free / 2**20
    return (
        f"checkpoint not written at round {done} ({error}; {free_mb:,.0f} MB free on its disk): "
        "the run goes on, and a resume would start from the last checkpoint written"
    )


def _fresh_or_resumed(
    exp: Experiment, saved_at: Path, base: str, resume: bool, report: ProgressCallback
) -> Progress:
    """Where the loop starts: with ``resume``, the checkpoint's state (the algorithm restored in
    place), or else, and before it where the ledger reaches a later round than the checkpoint,
    the last round the ledger reaches (rounds replayed into the algorithm: from the checkpoint's
    round where the ledger can continue it, else from 0); otherwise round 0. The untrained model
    is scored first either way (once per machine for each starting model and test set: see
    accuracy_cache)."""
    damaged: CheckpointDamaged | None = None
    saved = resume and saved_at.is_file()
    ahead = (
        saved
        and replayable(exp.algorithm)
        and ledger_ahead(saved_at.parent, checkpoint_round(saved_at))
    )

    def from_ledger(start: int) -> LedgerPoint | None:
        return resume_from_ledgers(
            exp.algorithm,
            saved_at.parent,
            exp.config,
            base,
            exp.data_identity,
            lambda done, total: report(done, {"event": "replay", "total": total}),
            start,
        )

    if saved and (not ahead or continues_a_checkpoint(exp.algorithm)):
        try:
            state = load_checkpoint(saved_at, exp.config, exp.algorithm, exp.data_identity)
        except CheckpointDamaged as error:
            damaged = error  # the algorithm is untouched: the ledger may still resume it
        else:
            text = f"resumed from {saved_at} at round {state.round}"
            point = from_ledger(state.round) if ahead else None
            if point is None:
                report(state.round, {"event": "note", "text": text})
                return state
            text += f" and from its ledger to round {point.round}"
            report(point.round, {"event": "note", "text": text})
            return Progress(*point, state.zero_shot_accuracy)
    with exp.algorithm.global_view():
        zero_shot = cached_accuracy(
            exp.algorithm.model, exp.test, exp.pad_id, exp.config.eval_batch_size
        )
    point = from_ledger(0) if resume else None
    if damaged is not None and point is None:
        raise damaged
    if point is not None:
        text = f"resumed from the ledger at round {point.round}"
        report(point.round, {"event": "note", "text": f"{damaged}; {text}" if damaged else text})
        return Progress(*point, zero_shot)
    if resume:
        text = f"no checkpoint {saved_at}: starting from scratch"
        report(0, {"event": "nothing_to_resume", "text": text})
    report(0, {"event": "zero_shot", "test_accuracy": zero_shot})
    return Progress(0, [], 0.0, 0.0, zero_shot)


def run(
    config: RunConfig,
    out_dir: str | Path,
    progress: ProgressCallback | None = None,
    *,
    resume: bool = False,
) -> dict[str, Any]:
    """Train, evaluate every ``eval_every`` rounds, and write results.json and history.jsonl.

    Every evaluation also writes a checkpoint (unless $SEEDFLOOD_CHECKPOINTS is off), and every
    SeedFlood or DZSGD round its ledger (`seedflood.sim.run_ledgers`); ``resume`` continues from
    the later of the two: a run killed at any point and resumed ends with the results of an
    uninterrupted one, bit for bit but for its timing fields. A finished run also writes its
    trained model (``model/``, as transformers saves one; the clients' average where they differ)
    and, for SeedFlood, its ledger (``messages.log`` and ``manifest.json``: `seedflood replay`
    rebuilds the model from them).
    The checkpoint is deleted once results.json is written, so resuming a finished run (without
    its results from ``compare``) starts it afresh.
    """
    begun = time.perf_counter()  # the run's wall time counts loading too
    out = Path(out_dir)
    saved_at = checkpoint_path(out)
    for name in ("results.json", "history.jsonl", saved_at.name):
        remove_stale_temporaries(out / name)
    # A run redone in the same directory must not leave the old results beside the new history.
    (out / "results.json").unlink(missing_ok=True)
    if not resume:
        saved_at.unlink(missing_ok=True)
    kill = kill_point()
    keep_checkpoints = checkpoints_wanted()
    report = progress or (lambda _round, _record: None)
    reset_peak_rss()
    torch.manual_seed(config.seed)
    device = run_device()
    with on_device(device), run_precision(config, device), Tracker(out, config) as tracker:
        exp = build(config, device)
        algorithm = exp.algorithm
        base = untrained_hash(algorithm)
        state = _fresh_or_resumed(exp, saved_at, base, resume, report)
        ledger = open_ledger(algorithm, out, config, base, exp.data_identity, state.round)
        history, train_seconds = state.history, state.train_seconds
        started = begun - state.wall_seconds

        def record(done: int, stats: dict[str, float]) -> None:
            entry = {"round": done, **stats, **evaluate(exp, exp.val), **algorithm.traffic()}
            entry["wall_seconds"] = time.perf_counter() - started
            entry["train_seconds"] = train_seconds
            history.append(entry)
            atomic_write_jsonl(out / "history.jsonl", history)
            tracker.log(history)
            maybe_kill(kill, done, "history")
            progress_now = Progress(
                done, history, train_seconds, entry["wall_seconds"], state.zero_shot_accuracy
            )
            if not keep_checkpoints:
                return
            try:
                save_checkpoint(saved_at, config, progress_now, algorithm, exp.data_identity)
            except (OSError, RuntimeError) as error:  # torch reports a full disk as RuntimeError
                report(done, {"event": "note", "text": _unsaved(saved_at, done, error)})

        if not history:
            record(0, {})
        # Resumed after the round that tripped the guard (the trip restored with the rest):
        # the run had ended there, and nothing is left to train.
        first = config.rounds if state.round and algorithm.stop_reason() else state.round
        for round_index in range(first, config.rounds):
            round_started = time.perf_counter()
            stats = algorithm.run_round(round_index)
            train_seconds += time.perf_counter() - round_started
            done = round_index + 1
            if ledger is not None:
                ledger.commit_round()
            maybe_kill(kill, done, "round")
            stopped = algorithm.stop_reason()
            if stopped:
                report(done, {"event": "note", "text": stopped})
            if stopped or done % config.eval_every == 0 or done == config.rounds:
                record(done, stats)
            if ledger is not None:
                mark_round(out, done, train_seconds, time.perf_counter() - started)
            maybe_kill(kill, done, "checkpoint")
            event = "evaluation" if history[-1]["round"] == done else "round"
            report(done, {**history[-1], **stats, "event": event})
            if stopped:
                break
        results = _results(config, exp, state.zero_shot_accuracy, device)
        if ledger is not None:
            results.update(ledger.close())
        if isinstance(config.task, TaskSpec) and config.task.eval_generate:
            with algorithm.global_view():
                generations = greedy_generations(algorithm.model, exp.tokenizer, exp.test)
            atomic_write_jsonl(out / "generations.jsonl", generations)
            matches = sum(row["match"] for row in generations)
            results["generated_exact_match"] = matches / len(generations)
        if config.save_model:
            with algorithm.global_view():
                save_model(algorithm.model, exp.tokenizer, out / "model")
            results["model_dir"] = "model"  # beside results.json
            results["model_bytes"] = sum(f.stat().st_size for f in (out / "model").rglob("*"))
        results["wall_seconds"] = time.perf_counter() - started
        results["train_seconds"] = train_seconds
        atomic_write_json(out / "results.json", results)
        saved_at.unlink(missing_ok=True)
        return results


def _results(
    config: RunConfig, exp: Experiment, zero_shot_accuracy: float, device: torch.device
) -> dict[str, Any]:
    """results.json's fields but the timings: the test scores of the trained model, its traffic,
    what it is (``describe`` and a hash of its weights) and what it was trained on."""
    algorithm = exp.algorithm
    traffic = algorithm.traffic()
    description = algorithm.describe()
    if "state_hash" not in description:
        with algorithm.global_view():
            description["state_hash"] = state_hash(list(algorithm.model.parameters()))
    return {
        "method": config.name,
        "task": config.task_name,
        "version": __version__,
        "zero_shot_accuracy": zero_shot_accuracy,
        "majority_accuracy": majority_rate(exp.test),
        **evaluate(exp, exp.test),
        **traffic,
        "rounds": config.rounds,
        "steps": config.rounds * config.steps_per_round,
        "clients": config.clients,
        "topology": config.topology,
        "diameter": exp.topology.diameter,
        **description,
        "parameters": exp.parameters,
        "test_examples": len(exp.test),
        "data_source": exp.data_source,
        "data_notes": exp.data_notes,
        "data": exp.data_identity,
        "peak_rss_mb": peak_rss_mb(),
        "device": str(device),
        "peak_device_mb": peak_device_mb(device),
        "config": config.model_dump(),
    }
