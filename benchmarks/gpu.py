"""A SeedFlood round on a GPU against a plain forward of the same sequences, in fp32 and bf16.

The model has SmolLM2-135M's shape (30 layers, width 576, MLP 1536, 9 heads, 3 key-value heads,
its 49,152-token vocabulary) and random weights, so nothing is downloaded or converted. For each
client count and forward precision (the run config's ``dtype``) it times, after --warmup
repetitions, --reps repetitions of

- the plain forward: the sequences one SeedFlood round forwards (each client's batch twice, for
  x ± εu), in the chunks and padding the round uses (`shared_losses`), through the model alone;
- the same sequences as one batch padded to the longest;
- the round's forwards alone (`SeedFlood.estimates`);
- the round: `SeedFlood.run_round` with hops = diameter, the same forwards with every client's
  perturbation added by the correction hooks, then flooding and the commit;

with ``torch.cuda.synchronize()`` around each. --graphs on times the round as a run makes it
(its bf16 forwards replayed as CUDA graphs: seedflood.algorithms.graphs) and also the plain
forward replayed as a graph; --graphs off keeps every forward eager; a GPU does both by default.
It writes their medians, the ratio round / plain
forward, the padding of those forwards, the peak GPU memory and how often one more round made
the CPU wait for the GPU (and from which lines) to OUT/gpu.json with the device name and the
torch version, row by row. --tokens sets the padded tokens per forward (the device's default
otherwise, `batched.forward_tokens`). --profile runs one more round per row under torch.profiler,
once every row is timed, and keeps the operations with the most self time (GPU time on a GPU).

Batches come from SST-2 in $SEEDFLOOD_DATA_DIR when it holds sst2/, else from the synthetic
SST-2-shaped task (short phrases: fewer tokens than SST-2). The tokenizer is SmolLM2's, from
seedflood's cache ($SEEDFLOOD_CACHE, see seedflood.learning.models). On a lent GPU nothing can
be fetched: carry the tokenizer, the data and pydantic (which the run config needs; the device
image lacks it) in a folder that .git/info/exclude ignores, say .gpu/:

    mkdir -p .gpu/cache/smollm2-135m-tokenizer .gpu/data
    cp ~/.cache/seedflood/smollm2-135m-instruct/tokenizer* .gpu/cache/smollm2-135m-tokenizer/
    cp -r ../shared/data/sst2 .gpu/data/
    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform \\
        manylinux_2_17_x86_64 -d .gpu/wheels pydantic pydantic-core annotated-types \\
        typing-inspection
    # there, carrying .gpu:
    pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
    PYTHONPATH=src:/tmp/site SEEDFLOOD_CACHE=.gpu/cache SEEDFLOOD_DATA_DIR=.gpu/data \\
        python3 benchmarks/gpu.py --device cuda --profile --out $OUT

The CUDA tests import the peers too: add wheels of gguf, datasets, hivemind, cryptography and
their dependencies the image lacks (about 25 MB in all). The H100 call of 2026-11-27 that wrote
results/bench/gpu.json took 90 s for four rows and their profiles (docs/performance.md).

Here, a smoke test (tests/test_gpu_bench.py runs a smaller one):

    .venv/bin/python benchmarks/gpu.py --device cpu --clients 4 --reps 1
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from timing import machine
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from seedflood.algorithms.batched import forward_tokens, padding, shared_losses
from seedflood.algorithms.graphs import ForwardGraphs
from seedflood.algorithms.seedflood import SeedFlood
from seedflood.build import build_parts, on_device, run_precision
from seedflood.config import RunConfig
from seedflood.files import atomic_write_json
from seedflood.learning.models import load_model
from seedflood.learning.synthetic import write_synthetic_sst2
from seedflood.learning.tasks import data_dir_from_env
from seedflood.sim.runner import build_algorithm

SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    "tie_word_embeddings": True,
}


def smollm2_shaped(tokenizer: PreTrainedTokenizerBase, layers: int) -> LlamaForCausalLM:
    """SmolLM2-135M's architecture with random weights (seed 0) and ``layers`` layers, in fp32
    on the CPU: the compute of the real model without its checkpoint."""
    config = LlamaConfig(
        **{**SMOLLM2_135M, "num_hidden_layers": layers},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model.eval().requires_grad_(False)


def timed(action: Callable[[], object], device: torch.device) -> float:
    """Seconds ``action`` takes, the GPU's queue drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    action()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def top_operations(algorithm: SeedFlood, round_index: int, device: torch.device) -> list[dict]:
    """One round under torch.profiler: the 15 operations with the most self time (on a GPU,
    GPU time), with their share of all operations' self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiler:
        algorithm.run_round(round_index)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in profiler.key_averages() if getattr(e, attribute) > 0]
    total = sum(getattr(e, attribute) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, attribute), reverse=True)
    return [
        {
            "op": e.key,
            "self_ms": getattr(e, attribute) / 1e3,
            "share": getattr(e, attribute) / total,
            "calls": e.count,
        }
        for e in events[:15]
    ]


def synchronizations(action: Callable[[], object], device: torch.device) -> dict[str, Any]:
    """How often ``action`` makes the CPU wait for the GPU (torch's sync debug mode), and from
    which lines: each wait stops the CPU from queueing work ahead of the GPU."""
    if device.type != "cuda":
        return {"count": 0, "where": {}}
    where: collections.Counter[str] = collections.Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            action()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if "synchroniz" in str(warning.message):
            where[f"{Path(warning.filename).name}:{warning.lineno}"] += 1
    return {"count": sum(where.values()), "where": dict(where.most_common(10))}


def graph_use(graphs: ForwardGraphs) -> dict[str, Any]:
    return {"recorded": graphs.recorded, "replayed": graphs.replayed, "failure": graphs.failure}


def measure(
    model: LlamaForCausalLM,
    config: RunConfig,
    tokens: int,
    graphs: bool,
    args: argparse.Namespace,
    device: torch.device,
) -> tuple[dict[str, Any], SeedFlood]:
    """One row: the plain forward and the round at ``config``'s clients and precision, with
    ``tokens`` padded tokens per forward, the round's forwards replayed from CUDA graphs or not
    (``graphs``: then the plain forward is also timed replayed); and the algorithm, for a
    profile once every row is timed (a profile takes longer than the row)."""
    with on_device(device), run_precision(config, device):
        parts = build_parts(config, device)
        parts.model = model
        algorithm = build_algorithm(config, parts)
        assert isinstance(algorithm, SeedFlood)
        algorithm.tokens_per_forward = tokens
        if not graphs:
            algorithm.graphs = None
        plain_graphs = ForwardGraphs() if algorithm.graphs is not None else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        plain, one_batch, estimates, rounds, real, padded = [], [], [], [], 0, 0
        plain_graphed: list[float] = []
        for index in range(args.warmup + args.reps):
            step = index * algorithm.local_steps
            batches = [algorithm.batch(c, step) for c in range(config.clients) for _ in "+-"]
            references = [(plain, tokens, None), (one_batch, 1 << 30, None)]
            if plain_graphs is not None:
                references.append((plain_graphed, tokens, plain_graphs))
            for times, budget, replays in references:
                forward = functools.partial(
                    shared_losses, model, batches, parts.pad_id, budget, replays
                )
                times.append(timed(forward, device))
            estimates.append(timed(lambda s=step: algorithm.estimates(s), device))
            rounds.append(timed(lambda i=index: algorithm.run_round(i), device))
            real, padded = padding(batches, tokens)
        plain, one_batch = plain[args.warmup :], one_batch[args.warmup :]
        estimates, rounds = estimates[args.warmup :], rounds[args.warmup :]
        plain_graphed = plain_graphed[args.warmup :]
        row: dict[str, Any] = {
            "clients": config.clients,
            "dtype": config.dtype,
            "graphs": graphs,
            "tokens_per_forward": tokens,
            "plain_forward_seconds": statistics.median(plain),
            "round_seconds": statistics.median(rounds),
            "ratio": statistics.median(rounds) / statistics.median(plain),
            "estimates_seconds": statistics.median(estimates),
            "one_batch_forward_seconds": statistics.median(one_batch),
            "plain_forward_all": plain,
            "round_all": rounds,
            "sequences": 2 * config.clients * config.batch_size,
            "real_tokens": real,
            "padded_tokens": padded,
            "padding_ratio": padded / real,
        }
        if algorithm.graphs is not None and plain_graphs is not None:
            row["plain_forward_graphed_seconds"] = statistics.median(plain_graphed)
            row["ratio_to_graphed_plain"] = row["round_seconds"] / statistics.median(plain_graphed)
            row["graph_use"] = {
                "round": graph_use(algorithm.graphs),
                "plain": graph_use(plain_graphs),
            }
        if device.type == "cuda":
            row["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        after = args.warmup + args.reps
        row["synchronizations"] = synchronizations(lambda: algorithm.run_round(after), device)
    return row, algorithm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", help="per forward (default: the device's)")
    parser.add_argument(
        "--graphs",
        nargs="+",
        default=["on", "off"],
        choices=["on", "off"],
        help="rounds' forwards replayed from CUDA graphs (a GPU's default), eager, or both",
    )
    parser.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    device = torch.device(args.device)
    budgets = args.tokens or [forward_tokens(device)]
    model = smollm2_shaped(load_model("tiny")[1], args.layers).to(device)
    given = data_dir_from_env()
    real_data = given is not None and (given / "sst2").is_dir()
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": machine(),
        "model": {**SMOLLM2_135M, "num_hidden_layers": args.layers, "weights": "random"},
        "data": "sst2" if real_data else "synthetic sst2",
        "batch": args.batch,
        "reps": args.reps,
        "warmup": args.warmup,
        "rows": [],
    }
    profiled: list[tuple[dict[str, Any], SeedFlood, RunConfig]] = []
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = given if real_data else write_synthetic_sst2(Path(scratch), 4096, 8)
        graph_modes = args.graphs or (["on", "off"] if device.type == "cuda" else ["off"])
        rows = itertools.product(args.clients, args.dtypes, budgets, graph_modes)
        for clients, dtype, tokens, graphed in rows:
            config = RunConfig(
                model="tiny",
                task="sst2",
                data_dir=str(data_dir),
                clients=clients,
                topology="ring",
                batch_size=args.batch,
                n_train=2 * clients * args.batch,
                n_val=1,
                n_test=1,
                dtype=dtype,
                batched_forward=True,
                lr=1e-4,
            )
            label = f"{clients:>4} clients {dtype} {tokens:>6} tokens/forward graphs {graphed}"
            started = time.perf_counter()
            try:
                row, algorithm = measure(model, config, tokens, graphed == "on", args, device)
                profiled.append((row, algorithm, config))
            except Exception as error:  # a lent GPU's minutes: keep the other rows
                traceback.print_exc()
                row = {"clients": clients, "dtype": dtype, "tokens_per_forward": tokens}
                row["graphs"] = graphed == "on"
                row["error"] = f"{type(error).__name__}: {error}"
                print(f"{label}: failed, {row['error']}", flush=True)
            else:
                print(
                    f"{label}: plain forward {row['plain_forward_seconds']:.4f} s, round "
                    f"{row['round_seconds']:.4f} s (estimates {row['estimates_seconds']:.4f} s), "
                    f"ratio {row['ratio']:.2f}, padding {row['padding_ratio']:.2f}x, one batch "
                    f"{row['one_batch_forward_seconds']:.4f} s, "
                    f"{row['synchronizations']['count']} syncs, "
                    f"graphed plain forward {row.get('plain_forward_graphed_seconds', 0):.4f} s "
                    f"(round / it {row.get('ratio_to_graphed_plain', 0):.2f}), "
                    f"graphs {row.get('graph_use')}, "
                    f"{time.perf_counter() - started:.0f} s to measure",
                    flush=True,
                )
            result["rows"].append(row)
            atomic_write_json(args.out / "gpu.json", result)
        for row, algorithm, config in profiled if args.profile else []:
            with on_device(device), run_precision(config, device):
                row["profile"] = top_operations(algorithm, args.warmup + args.reps + 1, device)
            atomic_write_json(args.out / "gpu.json", result)


if __name__ == "__main__":
    main()
