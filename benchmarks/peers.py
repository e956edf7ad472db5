"""Real peers against the simulator on the same config: same model, and what the wire carried.

Launches N `seedflood peer` processes on this machine (as `seedflood launch` does), runs the
simulator on the same config with one client at a time and the peers' thread count, and prints
whether the committed-state hashes agree, the flood traffic per edge of both, the pull-repair
bytes, and the time per round.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/peers.py [--peers 4] [--rounds 20] \
        [--model smollm2-135m] [--repeat 3] [--out results/bench]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from seedflood.config import load_config
from seedflood.files import atomic_write_json
from seedflood.peers.launch import launch, peer_threads
from seedflood.peers.state import state_hash
from seedflood.sim.runner import build


def simulate(config_file: Path, threads: int) -> dict[str, float | str]:
    """The simulator on the peers' numerics: float results depend on the thread count."""
    config = load_config(config_file, [])
    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    experiment = build(config)
    for round_index in range(config.rounds):
        experiment.algorithm.run_round(round_index)
    return {
        "state_hash": state_hash(experiment.algorithm.direction.matrices),
        "seconds": time.perf_counter() - started,
        **experiment.algorithm.traffic(),
    }


def measure(config: dict, peers: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        config_file = Path(scratch) / "peers.yaml"
        config_file.write_text(yaml.safe_dump(config))
        started = time.perf_counter()
        real = launch(config_file, peers=peers, out_dir=Path(scratch) / "run", run_id="bench")
        launch_seconds = time.perf_counter() - started
        simulated = simulate(config_file, peer_threads(peers))
    return {
        "hashes_equal_among_peers": real["consensus"],
        "equal_to_simulator": real["state_hash"] == simulated["state_hash"],
        "launch_seconds": launch_seconds,
        "peer_train_seconds": real["train_seconds"],
        "simulator_seconds": simulated["seconds"],
        "accuracy": real["accuracy"],
        "zero_shot_accuracy": real["zero_shot_accuracy"],
        **{
            f"{side}_{key}": source[key]
            for side, source in (("real", real), ("simulated", simulated))
            for key in ("bytes_per_edge_max", "messages_per_edge_max", "bytes_per_edge_mean")
        },
        "real_repair_bytes": real["repair_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--topology", default="ring")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    config = {
        "model": args.model,
        "task": "sst2",
        "clients": args.peers,
        "topology": args.topology,
        "rounds": args.rounds,
        "batch_size": 8,
        "lr": 0.01,
        "n_test": 100,
        "eval_every": args.rounds,
        "eval_examples": 100,
        "batched_forward": False,
    }
    runs = [measure(config, args.peers) for _ in range(args.repeat)]
    row = {
        "config": config,
        "peers": args.peers,
        "threads_per_peer": peer_threads(args.peers),
        "repeats": args.repeat,
        **{
            f"median_{key}": statistics.median(run[key] for run in runs)
            for key in ("launch_seconds", "peer_train_seconds", "simulator_seconds")
        },
        "runs": runs,
    }
    print(json.dumps(row, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "peers.json", row)


if __name__ == "__main__":
    main()
