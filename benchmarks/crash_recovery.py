"""Whether GWTF's crash recovery redoes only the crashed stage, on real stages of SmolLM2's shape.

The GWTF paper claims crashes mid-backward are recovered "avoiding costly recomputation": the
relays beside the dead one re-send the activation and gradient they kept, so a replacement of
the crashed stage runs one forward and one backward, where restarting the microbatch would run
every stage again. The simulator charges recovery that way (pipeline/ledger.py); this checks it on
real executions. A randomly initialised Llama of SmolLM2-135M's shape is split into --stages
stages, two replicas each; microbatch 0 runs on replica 0 of every stage and the others on
replica 1. One calm iteration is the reference; then, for every stage, a fresh iteration in which
the relay serving microbatch 0 crashes when the gradient reaches it. Per crash it records the
forwards and backwards each stage ran beyond the calm iteration, whether the iteration's loss
equals the calm one bit for bit, how far any surviving replica's weights moved from the calm
run's (against the size of the step itself), and the seconds recovery took against the seconds
of the microbatch's whole calm forward and backward. Writes OUT/crash_recovery.json:

    python benchmarks/crash_recovery.py [--layers 30] [--stages 6] [--microbatches 4] \\
        [--seq-len 64] --out results/bench
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from timing import machine
from torch import Tensor

from seedflood.files import atomic_write_json
from seedflood.pipeline.calibration import llama_from_smollm2
from seedflood.pipeline.stages import PipelineTrainer, Stage, split_llama
from seedflood.report import markdown_table

LR = 0.01


class TimedRecovery(PipelineTrainer):
    """A trainer that also times each stage it recovers."""

    def __init__(self, stages: list[Stage]) -> None:
        super().__init__(stages, replicas_per_stage=2)
        self.recovery_seconds = 0.0

    def recover_stage(self, stage: int, microbatch_id: int, replacement: int) -> None:
        started = time.perf_counter()
        super().recover_stage(stage, microbatch_id, replacement)
        self.recovery_seconds += time.perf_counter() - started


def microbatches(vocab: int, count: int, rows: int, seq_len: int) -> list[dict[str, Tensor]]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        ids = torch.randint(vocab, (rows, seq_len), generator=generator)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return batches


def calm_iteration(
    stages: list[Stage], batches: list[dict[str, Tensor]], paths: list[list[int]]
) -> tuple[PipelineTrainer, float, float]:
    """The reference iteration, timing microbatch 0's forward and backward through every stage."""
    trainer = TimedRecovery(stages)
    trainer.begin_iteration(batches, paths)
    started = time.perf_counter()
    trainer.forward_microbatch(0)
    restart = time.perf_counter() - started
    for microbatch_id in range(1, len(batches)):
        trainer.forward_microbatch(microbatch_id)
    started = time.perf_counter()
    trainer.backward_microbatch(0)
    restart += time.perf_counter() - started
    for microbatch_id in range(1, len(batches)):
        trainer.backward_microbatch(microbatch_id)
    return trainer, trainer.step(LR), restart


def counts(trainer: PipelineTrainer, kind: str) -> list[list[int]]:
    return [[getattr(w, f"{kind}_count") for w in workers] for workers in trainer.replicas]


def weight_gap(calm: PipelineTrainer, crashed: PipelineTrainer, stages: list[Stage]) -> float:
    """The largest difference between a surviving replica's weights and the calm run's, over the
    largest change the step made to any weight (so 0 is exact and 1 is a whole step off)."""
    gap = step = 0.0
    for index, start in enumerate(stages):
        for calm_worker, crashed_worker in zip(
            calm.replicas[index], crashed.replicas[index], strict=True
        ):
            for before, ours, theirs in zip(
                start.parameters(),
                calm_worker.stage.parameters(),
                crashed_worker.stage.parameters(),
                strict=True,
            ):
                step = max(step, (ours - before).abs().max().item())
                if crashed_worker.alive:
                    gap = max(gap, (ours - theirs).abs().max().item())
    return gap / step


def crash_at(
    stage: int,
    stages: list[Stage],
    batches: list[dict[str, Tensor]],
    paths: list[list[int]],
    calm: PipelineTrainer,
    calm_loss: float,
) -> dict[str, Any]:
    crashed = TimedRecovery(stages)
    loss = crashed.train_iteration(batches, paths, LR, backward_crashes={0: (stage, 1)})
    extra: dict[str, list[int]] = {}
    for kind in ("forward", "backward"):
        ours, theirs = counts(calm, kind), counts(crashed, kind)
        extra[kind] = [
            sum(
                t - o
                for t, o, worker in zip(theirs[i], ours[i], crashed.replicas[i], strict=True)
                if worker.alive
            )
            for i in range(len(stages))
        ]
    return {
        "stage": stage,
        "extra_forwards": extra["forward"],
        "extra_backwards": extra["backward"],
        "loss_equal": loss == calm_loss,
        "weight_gap": weight_gap(calm, crashed, stages),
        "recovery_seconds": crashed.recovery_seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--stages", type=int, default=6)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=2, help="sequences per microbatch")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    if args.microbatches < 2 or args.stages < 2:
        parser.error("--microbatches and --stages must be at least 2")
    model = llama_from_smollm2(layers=args.layers, seed=0)
    stages = split_llama(model, args.stages)
    batches = microbatches(model.config.vocab_size, args.microbatches, args.rows, args.seq_len)
    paths = [[0 if m == 0 else 1] * args.stages for m in range(args.microbatches)]
    calm, calm_loss, restart = calm_iteration(stages, batches, paths)
    crashes = [crash_at(s, stages, batches, paths, calm, calm_loss) for s in range(args.stages)]
    header = ["crashed stage", "extra forwards", "extra backwards", "loss equal", "weight gap"]
    rows = [
        [
            *(str(c[key]) for key in ("stage", "extra_forwards", "extra_backwards", "loss_equal")),
            f"{c['weight_gap']:.1e}",
            f"{c['recovery_seconds']:.3f}",
        ]
        for c in crashes
    ]
    print(markdown_table([*header, "recovery s"], rows))
    print(f"restarting microbatch 0 instead: {restart:.3f} s through all {args.stages} stages")
    atomic_write_json(
        args.out / "crash_recovery.json",
        {
            "machine": machine(),
            "model": "smollm2-135m shape, random weights",
            "layers": model.config.num_hidden_layers,
            "stages": args.stages,
            "replicas_per_stage": 2,
            "microbatches": args.microbatches,
            "rows": args.rows,
            "seq_len": args.seq_len,
            "lr": LR,
            "restart_seconds": restart,
            "crashes": crashes,
        },
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
