"""Does first-order gossip train on this GPU as it does on the CPU? Run it on a lent GPU before
any first-order lane (tools/lent-gpu.sh runs it when LENT_FO_CHECK=1).

DSGD and ChocoSGD runs of 16 SmolLM2-135M clients on an H100 and an H200 fell to a training loss
of exactly ln 2 (one answer for every sentence, no gradient left) within 25 steps at every rate
tried, while the same configuration trains on the CPU: 0.877 after round 1 and 0.489 after round
5 at lr 0.00125 (results/bench/gpu-fo/dsgd-cpu-16-clients-lr-0.00125.history.jsonl). The cause,
found with check 1 on an H200 (2026-11-28): torch's sparse product of W with wide states returned
zeros there; gossip now mixes with a dense W on a GPU (`gossip.mixing_operator`). Two checks:

1. mixing: the ring's W, as gossip builds it for the device, times column chunks of a
   16 × 134,515,008 state (8.6 GB, past 2³¹ elements), passed strided and through
   `mixed_chunks`, each against the same columns' product on the CPU (sparse: 1.0, zeros;
   dense: 3.2e-8; results/bench/gpu-fo/mixing-h200.json);
2. training: that CPU run's configuration for two rounds on the GPU, whose train losses must be
   the CPU's within 2% (two rounds, so that one mixing lies between them): on the H200 after the
   fix, 0.87736427 and 0.59866727 against the CPU's 0.87736427 and 0.59866732
   (results/bench/gpu-fo/check-h200.json).

Prints what it found, writes it as JSON to --out and exits 1 where the GPU differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from seedflood.algorithms.gossip import CHUNK, mixed_chunks, mixing_operator
from seedflood.config import load_config
from seedflood.files import atomic_write_json, read_jsonl
from seedflood.sim.runner import build
from seedflood.topology import make_topology

SMOLLM2_PARAMETERS = 134_515_008
REFERENCE = Path("results/bench/gpu-fo/dsgd-cpu-16-clients-lr-0.00125.history.jsonl")
SETTINGS = (  # the reference run's command: seedflood run configs/quickstart.yaml --set ...
    "method=dsgd", "lr=0.00125", "rounds=20", "local_steps=5", "eval_every=1",
    "eval_examples=40", "eval_clients=1", "n_test=40",
)  # fmt: skip
LOSS_TOLERANCE = 0.02  # relative; a collapse to ln 2 is 16% off at round 2


def mixing_errors(
    device: torch.device, clients: int = 16, d: int = SMOLLM2_PARAMETERS
) -> dict[str, float]:
    """Largest relative error of ``device``'s mixed first and last chunks against the CPU's,
    with the chunk passed strided (the old way) and through ``mixed_chunks``."""
    matrix = make_topology("ring", clients).mixing_matrix("metropolis")
    mixing = torch.from_numpy(matrix).float()
    generator = torch.Generator(device).manual_seed(0)
    state = torch.randn(clients, d, device=device, generator=generator)
    on_device = mixing_operator(matrix, device)
    last = (d - 1) // CHUNK * CHUNK
    errors = {"strided": 0.0, "mixed_chunks": 0.0}
    for columns, mixed in mixed_chunks(on_device, state):
        if columns.start not in (0, last):
            continue
        expected = mixing @ state[:, columns].cpu()
        scale = float(expected.abs().max())
        for name, got in (("strided", on_device @ state[:, columns]), ("mixed_chunks", mixed)):
            errors[name] = max(errors[name], float((got.cpu() - expected).abs().max()) / scale)
    return errors


def training_losses(device: torch.device, rounds: int = 2) -> dict[str, list[float]]:
    """Train losses of the reference configuration's first rounds on ``device`` (its rounds
    alone: evaluations and checkpoints change nothing a round computes) and on the CPU."""
    config = load_config("configs/quickstart.yaml", list(SETTINGS))
    with device:
        algorithm = build(config, device).algorithm
        here = [algorithm.run_round(index)["train_loss"] for index in range(rounds)]
    cpu = [r["train_loss"] for r in read_jsonl(REFERENCE) if "train_loss" in r][:rounds]
    return {"measured": here, "cpu_reference": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench/gpu-fo/check.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU here: this check is for a lent GPU", file=sys.stderr)
        return 2
    errors = mixing_errors(torch.device("cuda"))
    losses = training_losses(torch.device("cuda"))
    mixing_ok = errors["mixed_chunks"] < 1e-5
    training_ok = all(
        math.isclose(g, c, rel_tol=LOSS_TOLERANCE)
        for g, c in zip(losses["measured"], losses["cpu_reference"], strict=True)
    )
    found = {
        "device": torch.cuda.get_device_name(),
        "mixing_relative_error": errors,
        "train_loss_by_round": losses,
        "mixing_ok": mixing_ok,
        "training_ok": training_ok,
    }
    atomic_write_json(args.out, found)
    print(json.dumps(found, indent=2))
    return 0 if mixing_ok and training_ok else 1


if __name__ == "__main__":
    sys.exit(main())
