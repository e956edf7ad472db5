"""Forward throughput of zeroth-order steps against the machine's matrix-product roofline.

One zeroth-order step of every client needs f(x_c ± εu_c) on its minibatch. Evaluated one client at
a time that is 2n small forwards; batched, all 2n perturbed models share forwards over the base
weights (seedflood.algorithms.batched). Both score the same examples, so client-steps per second
compare at equal tokens. FLOP/s counts 2 × (parameters outside the embedding) per real (unpadded)
token, next to the FLOP/s of a 2048² fp32 matrix product measured in the same run. Medians of
--repeats. SeedFlood's clients differ by SubCGE updates; with --lora, DZSGD-LoRA's by their own
adapters (rank 8 on q_proj and v_proj, the runs' default), written to forward_dzsgd_lora.json.

    SEEDFLOOD_DATA_DIR=../shared/data python benchmarks/forward.py [--clients 128] [--batch 8]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from timing import median_seconds
from torch import nn

from seedflood.algorithms.batched import Segment, row_weight_losses, segment_losses
from seedflood.files import atomic_write_json
from seedflood.learning.models import add_lora, load_model
from seedflood.learning.scoring import loss_and_correct, tokenize
from seedflood.learning.tasks import data_dir_from_env, load_task
from seedflood.zo import SubCGEDirection, message_seed, trainable_matrices


def matmul_flops(repeats: int) -> float:
    a = torch.randn(2048, 2048)
    a @ a
    return 2 * 2048**3 / median_seconds(lambda: a @ a, repeats)


def subcge_steps(model: nn.Module, batches: list, pad_id: int) -> tuple[Callable, Callable]:
    """SeedFlood's step of every client batched, and of the first ``few`` one at a time."""
    direction = SubCGEDirection(trainable_matrices(model), rank=32, refresh=1000, run_seed=0)
    direction.basis(0)
    segments = [
        Segment(batch, [(message_seed(0, c, 0), 0, sign * 1e-3)])
        for c, batch in enumerate(batches)
        for sign in (1.0, -1.0)
    ]

    def one_by_one(few: int) -> None:
        for c in range(few):
            touch = direction.touch(message_seed(0, c, 0), 0)
            saved = touch.snapshot()
            for sign in (1.0, -1.0):
                touch.add_(sign * 1e-3)
                loss_and_correct(model, batches[c], pad_id)
                touch.restore(saved)

    return lambda: segment_losses(model, direction, segments, pad_id), one_by_one


def lora_steps(model: nn.Module, batches: list, pad_id: int) -> tuple[Callable, Callable]:
    """DZSGD-LoRA's step of every client batched (2 adapters per client), and one at a time."""
    params = add_lora(model, rank=8, alpha=16, targets=("q_proj", "v_proj"), seed=0)
    d = sum(p.numel() for p in params)
    adapters = torch.randn(2 * len(batches), d, generator=torch.Generator().manual_seed(0)) * 0.01
    paired = [batch for batch in batches for _ in range(2)]

    def one_by_one(few: int) -> None:
        for row in range(2 * few):
            offset = 0
            for p in params:
                p.data = adapters[row, offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            loss_and_correct(model, paired[row], pad_id)

    return lambda: row_weight_losses(model, params, adapters, paired, pad_id), one_by_one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--one-by-one-clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora", action="store_true", help="measure DZSGD-LoRA, not SeedFlood")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    if data_dir_from_env() is None:
        parser.error("set SEEDFLOOD_DATA_DIR to the directory holding sst2/train.jsonl")
    model, tokenizer = load_model("smollm2-135m")
    data = load_task("sst2", n_train=args.clients * args.batch, n_val=1, n_test=1)
    examples = tokenize(tokenizer, data.train, 256)
    batches = [examples[c * args.batch : (c + 1) * args.batch] for c in range(args.clients)]
    compute = (
        sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    )
    pad_id = tokenizer.pad_token_id

    def tokens(clients: int) -> int:
        return 2 * sum(len(e.prompt) for batch in batches[:clients] for e in batch)

    steps = lora_steps if args.lora else subcge_steps
    all_clients, one_by_one = steps(model, batches, pad_id)
    matmul = matmul_flops(args.repeats * 3)
    batched = median_seconds(all_clients, args.repeats)
    matmul_after = matmul_flops(args.repeats * 3)
    few = args.one_by_one_clients
    single = median_seconds(lambda: one_by_one(few), args.repeats)
    batched_flops = 2 * compute * tokens(args.clients) / batched
    single_flops = 2 * compute * tokens(few) / single
    matmul_best = max(matmul, matmul_after)
    result = {
        "model": "smollm2-135m",
        "method": "dzsgd-lora" if args.lora else "seedflood",
        "compute_parameters": compute,
        "clients": args.clients,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "matmul_flops": matmul_best,
        "batched_seconds_per_step_of_all_clients": batched,
        "batched_client_steps_per_second": args.clients / batched,
        "batched_flops": batched_flops,
        "batched_roofline_ratio": batched_flops / matmul_best,
        "one_by_one_clients": few,
        "one_by_one_client_steps_per_second": few / single,
        "one_by_one_flops": single_flops,
        "one_by_one_roofline_ratio": single_flops / matmul_best,
        "batched_speedup": (args.clients / batched) / (few / single),
        "tokens_per_client_step": tokens(args.clients) / args.clients,
    }
    print(f"matmul 2048² fp32: {matmul_best / 1e9:.1f} GFLOP/s ({result['threads']} threads)")
    print(
        f"batched, {args.clients} clients × 2 × {args.batch} examples: "
        f"{batched_flops / 1e9:.1f} GFLOP/s = {result['batched_roofline_ratio']:.0%} of matmul, "
        f"{result['batched_client_steps_per_second']:.2f} client-steps/s"
    )
    print(
        f"one client at a time ({few} clients): {single_flops / 1e9:.1f} GFLOP/s = "
        f"{result['one_by_one_roofline_ratio']:.0%}, "
        f"{result['one_by_one_client_steps_per_second']:.2f} client-steps/s"
    )
    print(f"batched / one by one: {result['batched_speedup']:.2f}x client-steps per second")
    atomic_write_json(
        args.out / ("forward_dzsgd_lora.json" if args.lora else "forward.json"), result
    )


if __name__ == "__main__":
    main()
