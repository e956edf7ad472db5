"""Run n clients in one process: the loop every method shares.

config → model + task → clients → algorithm rounds → evaluation → results files. The algorithm
object owns what differs between methods (local steps, messages, transport); this loop only
schedules rounds and evaluations and writes what it measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from seedflood import __version__
from seedflood.algorithms.common import Algorithm
from seedflood.algorithms.gossip import Gossip, gossip_memory_bytes
from seedflood.algorithms.seedflood import SeedFlood
from seedflood.config import ConfigError, RunConfig
from seedflood.metrics import atomic_write_json, atomic_write_jsonl, peak_rss_mb
from seedflood.models import add_lora, load_model
from seedflood.scoring import TokenizedExample, accuracy, tokenize
from seedflood.tasks import load_task, partition
from seedflood.topology import Topology, make_topology
from seedflood.zo import make_direction

ProgressCallback = Callable[[int, dict[str, Any]], None]


@dataclass
class Experiment:
    """Everything a run is built from, before its first step."""

    config: RunConfig
    topology: Topology
    algorithm: Algorithm
    val: list[TokenizedExample]
    test: list[TokenizedExample]
    pad_id: int
    data_notes: list[str]
    data_source: str
    parameters: int


def check_memory(config: RunConfig, trainable: int) -> None:
    """Refuse before the first step a run whose client states cannot fit in memory."""
    if config.method == "seedflood":
        return
    needed = gossip_memory_bytes(config.clients, trainable, config.method == "choco")
    available = psutil.virtual_memory().available
    if needed > 0.9 * available:
        copies = "2 × " if config.method == "choco" else ""
        raise ConfigError(
            f"method {config.method} with {config.clients} clients keeps {copies}"
            f"{config.clients} × {trainable:,} fp32 values and working space: about "
            f"{needed / 1e9:.1f} GB, but only "
            f"{available / 1e9:.1f} GB of memory is available; use lora: true, fewer clients or "
            "a smaller model"
        )


def build_algorithm(
    config: RunConfig,
    model: nn.Module,
    topology: Topology,
    shards: list[list[TokenizedExample]],
    pad_id: int,
) -> Algorithm:
    common = {
        "model": model,
        "topology": topology,
        "shards": shards,
        "pad_id": pad_id,
        "lr": config.lr,
        "eps": config.eps,
        "batch_size": config.batch_size,
        "local_steps": config.steps_per_round,
        "run_seed": config.seed,
    }
    if config.method == "seedflood":
        direction = make_direction(
            config.direction, model, rank=config.rank, refresh=config.refresh, run_seed=config.seed
        )
        return SeedFlood(
            direction=direction,
            hops=config.hops or topology.diameter,
            scalar_format=config.scalar_format,
            batched=config.batched_forward,
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
    check_memory(config, sum(p.numel() for p in trainable))
    return Gossip(
        trainable=trainable,
        estimator="zo" if config.method == "dzsgd" else "gradient",
        mixing=config.mixing,
        topk_ratio=config.topk_ratio if config.method == "choco" else None,
        gamma=config.gamma,
        **common,
    )


def build(config: RunConfig) -> Experiment:
    topology = make_topology(
        config.topology,
        config.clients,
        seed=config.seed,
        degree=config.topology_degree,
        p=config.topology_p,
        path=config.edgelist,
    )
    data = load_task(
        config.task,
        data_dir=config.resolved_data_dir(),
        seed=config.seed,
        n_train=config.n_train,
        n_val=config.n_val,
        n_test=config.n_test,
    )
    shards = partition(
        data.train, config.clients, seed=config.seed, scheme=config.partition, alpha=config.alpha
    )
    model, tokenizer = load_model(config.model, seed=config.seed)
    pad_id = tokenizer.pad_token_id
    parameters = sum(p.numel() for p in model.parameters())
    algorithm = build_algorithm(
        config,
        model,
        topology,
        [tokenize(tokenizer, shard, config.max_length) for shard in shards],
        pad_id,
    )
    val = tokenize(tokenizer, data.val[: config.eval_examples or None], config.max_length)
    return Experiment(
        config=config,
        topology=topology,
        algorithm=algorithm,
        val=val,
        test=tokenize(tokenizer, data.test, config.max_length),
        pad_id=pad_id,
        data_notes=list(data.notes),
        data_source=data.source,
        parameters=parameters,
    )


def evaluate(exp: Experiment, examples: list[TokenizedExample]) -> dict[str, float]:
    """GMP accuracy, and the clients' own accuracy where their models differ from it."""
    algorithm, batch_size = exp.algorithm, exp.config.eval_batch_size
    with algorithm.global_view():
        global_accuracy = accuracy(algorithm.model, examples, exp.pad_id, batch_size)
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
    return {
        "accuracy": global_accuracy,
        "client_accuracy_mean": sum(client_accuracies) / len(client_accuracies),
        "client_accuracy_min": min(client_accuracies),
        "consensus_distance": algorithm.consensus_distance(),
    }


def run(
    config: RunConfig, out_dir: str | Path, progress: ProgressCallback | None = None
) -> dict[str, Any]:
    """Train, evaluate every ``eval_every`` rounds, and write results.json and history.jsonl."""
    out = Path(out_dir)
    # A run redone in the same directory must not leave the old results beside the new history.
    (out / "results.json").unlink(missing_ok=True)
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    exp = build(config)
    algorithm = exp.algorithm
    zero_shot = evaluate(exp, exp.test)["accuracy"]
    report = progress or (lambda _round, _record: None)
    report(0, {"event": "zero_shot", "test_accuracy": zero_shot})
    history: list[dict[str, Any]] = []
    train_seconds = 0.0

    def record(done: int, stats: dict[str, float]) -> None:
        entry = {"round": done, **stats, **evaluate(exp, exp.val), **algorithm.traffic()}
        entry["wall_seconds"] = time.perf_counter() - started
        entry["train_seconds"] = train_seconds
        history.append(entry)
        atomic_write_jsonl(out / "history.jsonl", history)

    record(0, {})
    for round_index in range(config.rounds):
        round_started = time.perf_counter()
        stats = algorithm.run_round(round_index)
        train_seconds += time.perf_counter() - round_started
        done = round_index + 1
        if done % config.eval_every == 0 or done == config.rounds:
            record(done, stats)
        event = "evaluation" if history[-1]["round"] == done else "round"
        report(done, {**history[-1], **stats, "event": event})
    final = evaluate(exp, exp.test)
    traffic = algorithm.traffic()
    results = {
        "method": config.name,
        "version": __version__,
        "zero_shot_accuracy": zero_shot,
        **final,
        **traffic,
        "rounds": config.rounds,
        "steps": config.rounds * config.steps_per_round,
        "clients": config.clients,
        "topology": config.topology,
        "diameter": exp.topology.diameter,
        **algorithm.describe(),
        "parameters": exp.parameters,
        "test_examples": len(exp.test),
        "data_source": exp.data_source,
        "data_notes": exp.data_notes,
        "wall_seconds": time.perf_counter() - started,
        "train_seconds": train_seconds,
        "peak_rss_mb": peak_rss_mb(),
        "config": config.model_dump(),
    }
    atomic_write_json(out / "results.json", results)
    return results
