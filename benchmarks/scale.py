"""How SeedFlood's simulator scales with clients: time per round, time outside forwards, memory.

For each client count and each flooding budget (hops = 1 and hops = diameter) a fresh process
builds the run (SmolLM2-135M, SST-2, ring, SubCGE, batched forwards) and times --rounds rounds.
With hops = 1 a message needs diameter rounds to reach everyone, so the messages in flight (and
the memory and work they cost) only reach their steady state after that many rounds. Those
rounds are *filled* first: they flood and commit real messages whose scalars are drawn at random
instead of computed by forward passes. Time inside the model's forward passes is measured by
wrapping the backbone's forward (correction terms of batched forwards included), so "outside" is
everything else: batch assembly, walking the shared weights, flooding, commits. Each figure is
the median over the timed rounds. Peak RSS is the child process's own.

With --stub-forwards the backbone returns zeros at once (no correction hooks run), so a round
costs only what lies outside the forwards: at 1,024 clients with hops = 1 that is minutes, where
the forwards take about an hour on this machine. Those rows go to scale_outside.json. --threads
sets torch's threads in the child (the default is torch's): on a shared machine two threads of
small operations wait on each other more than they compute. --label tags the rows of one
version of the code, so that a before/after pair can sit in one file, and --filled DIR keeps the
filled state of each hops = 1 run in DIR, so that the second of the pair starts from the first's
instead of filling again (at 1,024 clients the fill takes most of an hour). With
--forward-sample N a stubbed run then times the real forwards of the next round's first N
groups of clients and estimates the share outside forwards of a round that has them.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/scale.py [--clients 16 64 128] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
from timing import machine

from seedflood.algorithms.seedflood import SeedFlood
from seedflood.files import atomic_write_json
from seedflood.sim.devices import peak_rss_mb


def measure(
    clients: int,
    hops: str,
    batch: int,
    rounds: int,
    stub: bool,
    filled: Path | None,
    forward_sample: int = 0,
) -> dict[str, float]:
    """One configuration, in this process."""
    from seedflood.config import RunConfig
    from seedflood.sim.runner import build

    config = RunConfig(
        clients=clients,
        topology="ring",
        batch_size=batch,
        n_train=max(1024, batch * clients),
        n_val=1,
        n_test=1,
        hops=1 if hops == "1" else None,
        batched_forward=True,
        lr=0.01,
    )
    algorithm = build(config).algorithm
    backbone = algorithm.model.base_model
    forward = backbone.forward
    hidden = algorithm.model.config.hidden_size
    inside = [0.0]

    def zeros(input_ids: torch.Tensor, **_: object) -> object:
        return types.SimpleNamespace(last_hidden_state=torch.zeros(*input_ids.shape, hidden))

    stubbed = [stub]

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return (zeros if stubbed[0] else forward)(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - started

    backbone.forward = timed
    fill = algorithm.topology.diameter if algorithm.hops < algorithm.topology.diameter else 1
    fill_seconds = None
    if filled is not None and filled.exists():
        load_filled(algorithm, filled)
    else:
        generator = torch.Generator().manual_seed(0)
        algorithm._estimates_batched = lambda step: [
            (float(g), 0.0) for g in torch.randn(clients, generator=generator)
        ]
        fill_started = time.perf_counter()
        for round_index in range(fill):
            algorithm.run_round(round_index)
        fill_seconds = (time.perf_counter() - fill_started) / fill
        del algorithm._estimates_batched
        if filled is not None:
            save_filled(algorithm, filled)
    seconds, outside = [], []
    for round_index in range(fill, fill + rounds):
        inside[0] = 0.0
        started = time.perf_counter()
        algorithm.run_round(round_index)
        seconds.append(time.perf_counter() - started)
        outside.append(seconds[-1] - inside[0])
    median = statistics.median(seconds)
    sampled = {}
    if stub and forward_sample:
        sampled = _sample_forwards(algorithm, fill + rounds, forward_sample, stubbed, inside)
        share = statistics.median(outside) / (
            statistics.median(outside) + sampled["forward_seconds_per_round_estimated"]
        )
        sampled["outside_forward_share_estimated"] = share
    return {
        "clients": clients,
        "hops": algorithm.hops,
        "batch": batch,
        "threads": torch.get_num_threads(),
        "forwards": "stubbed" if stub else "real",
        "seconds_per_round": median,
        "seconds_per_client_step": median / clients,
        "outside_seconds_per_round": statistics.median(outside),
        "outside_forward_share": statistics.median(
            o / s for o, s in zip(outside, seconds, strict=True)
        ),
        "round_seconds": seconds,
        "filled_rounds": fill,
        "seconds_per_filled_round": fill_seconds,
        "held_pending_messages": algorithm.pending_held(),
        "peak_rss_mb": peak_rss_mb(),
        **sampled,
    }


def _sample_forwards(
    algorithm: SeedFlood, step: int, sample: int, stubbed: list[bool], inside: list[float]
) -> dict[str, float]:
    """The real forwards of the first ``sample`` groups of clients of the next round, each on
    its own model as the round computes it (same walks, same batches), scaled to all groups: a
    round with real forwards at 1,024 clients takes an hour with one thread, so with
    --stub-forwards the forwards' share is estimated from this sample, measured in the same
    process as the stubbed rounds."""
    groups = algorithm._groups([algorithm.held(c) for c in range(algorithm.n)])
    algorithm._groups = lambda _helds: groups[:sample]
    stubbed[0], inside[0] = False, 0.0
    try:
        algorithm.estimates(step)
    finally:
        stubbed[0] = True
        del algorithm._groups
    per_group = inside[0] / min(sample, len(groups))
    return {
        "forward_sample_groups": min(sample, len(groups)),
        "groups_per_round": len(groups),
        "forward_seconds_per_group": per_group,
        "forward_seconds_per_round_estimated": per_group * len(groups),
    }


def save_filled(algorithm: SeedFlood, path: Path) -> None:
    """The state after the fill: what a run of another version of the code can start from, so
    that a before/after pair at 1,024 clients fills once (the fill takes most of an hour)."""
    state = {
        "floods": algorithm.floods,
        "pending": algorithm.pending,
        "committed_step": algorithm.committed_step,
        "weights": [t.clone() for t in algorithm.direction.tensors],
        "network": algorithm.network,
        "made": algorithm.messages_made,
        "guard": algorithm.guard,
    }
    path.write_bytes(pickle.dumps(state))


def load_filled(algorithm: SeedFlood, path: Path) -> None:
    """Continue from `save_filled`'s state. Coordinates that this version keeps for pending
    messages (seedflood.algorithms.pending) are drawn now, as the fill would have drawn them."""
    state = pickle.loads(path.read_bytes())
    for tensor, saved in zip(algorithm.direction.tensors, state["weights"], strict=True):
        tensor.copy_(saved)
    algorithm.floods, algorithm.pending = state["floods"], state["pending"]
    algorithm.committed_step, algorithm.messages_made = state["committed_step"], state["made"]
    algorithm.network, algorithm.guard = state["network"], state["guard"]
    for step in algorithm.pending if getattr(algorithm, "walks", None) else ():
        algorithm.walks.add(step)


def plot(rows: list[dict[str, float]], directory: Path) -> None:
    """Time per client-step and peak memory against clients, one line per flooding budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    charts = (
        ("scale_time.png", "seconds_per_client_step", "seconds per client-step"),
        ("scale_memory.png", "peak_rss_mb", "peak RSS (MB)"),
    )
    for filename, key, label in charts:
        figure, axes = plt.subplots(figsize=(5.5, 3.8))
        for name, diameter in (("hops = 1", False), ("hops = diameter", True)):
            points = sorted((r["clients"], r[key]) for r in rows if (r["hops"] > 1) == diameter)
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", label=name)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("clients (ring, SmolLM2-135M, SST-2)")
        axes.set_ylabel(label)
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(directory / filename, dpi=120)
        plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64, 128, 256, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hops", nargs="+", choices=("1", "diameter"), default=["1", "diameter"])
    parser.add_argument("--threads", type=int, help="torch threads in each run (default: torch's)")
    parser.add_argument("--stub-forwards", action="store_true", help="time what is outside them")
    parser.add_argument("--label", default="", help="tag of this version of the code")
    parser.add_argument("--filled", type=Path, help="folder of filled states to load or save")
    parser.add_argument(
        "--forward-sample",
        type=int,
        default=0,
        help="with --stub-forwards: time the real forwards of this many groups of clients",
    )
    parser.add_argument("--one", nargs=2, metavar=("CLIENTS", "HOPS"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    parser.add_argument("--plots", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        clients, hops = int(args.one[0]), args.one[1]
        filled = args.filled / f"{clients}-clients-batch-{args.batch}.pkl" if args.filled else None
        row = measure(
            clients, hops, args.batch, args.rounds, args.stub_forwards, filled, args.forward_sample
        )
        print(json.dumps({**row, "label": args.label}))
        return
    path = args.out / ("scale_outside.json" if args.stub_forwards else "scale.json")
    # Rows of earlier invocations (other client counts) are kept; a rerun replaces its own.
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    header = ("clients", 7), ("hops", 5), ("s/round", 8), ("s/step", 8), ("outside", 8), ("MB", 7)
    print(" ".join(f"{name:>{width}}" for name, width in header))
    for clients in args.clients:
        for hops in args.hops:
            command = [sys.executable, __file__, "--one", str(clients), hops, "--label", args.label]
            command += ["--batch", str(args.batch), "--rounds", str(args.rounds)]
            command += ["--threads", str(args.threads)] * bool(args.threads)
            command += ["--stub-forwards"] * args.stub_forwards
            command += ["--forward-sample", str(args.forward_sample)] * bool(args.forward_sample)
            command += ["--filled", str(args.filled)] * bool(args.filled and hops == "1")
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            row = json.loads(output.strip().splitlines()[-1])
            rows = [r for r in rows if _key(r) != _key(row)]
            rows.append(row)
            print(
                f"{row['clients']:>7} {row['hops']:>5} {row['seconds_per_round']:>8.1f} "
                f"{row['seconds_per_client_step']:>8.3f} {row['outside_forward_share']:>8.1%} "
                f"{row['peak_rss_mb']:>7.0f}"
            )
            if "outside_forward_share_estimated" in row:
                print(
                    f"  forwards of {row['forward_sample_groups']} of {row['groups_per_round']} "
                    f"groups: {row['forward_seconds_per_group']:.2f} s each, about "
                    f"{row['forward_seconds_per_round_estimated']:.0f} s a round; outside "
                    f"{row['outside_forward_share_estimated']:.1%} of a round with them"
                )
            rows.sort(key=_key)
            atomic_write_json(path, {"batch": args.batch, "machine": machine(), "rows": rows})
    if not args.stub_forwards:
        plot([r for r in rows if not r.get("label")], args.plots)


def _key(row: dict) -> tuple:
    """Which rows a rerun replaces: same clients, hops and label."""
    return row["clients"], row["hops"], row.get("label", "")


if __name__ == "__main__":
    main()
