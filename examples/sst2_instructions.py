"""Instruction data from SST-2 for the language-modelling objective: each review becomes a
prompt and " positive" or " negative" its completion (configs/instructions-sst2.yaml).

Writes OUT/train.jsonl (4,096 reviews drawn from SST-2's training file) and OUT/test.jsonl (500
from its validation file), both read from $SEEDFLOOD_DATA_DIR/sst2; the data stays outside the
repository (results/ is ignored):

    SEEDFLOOD_DATA_DIR=../shared/data .venv/bin/python examples/sst2_instructions.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

ANSWERS = ("negative", "positive")


def instructions(source: Path, count: int, seed: int) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    chosen = random.Random(seed).sample(rows, count)
    return [
        {
            "instruction": f"Review: {row['sentence'].strip()}\n"
            "Is this review positive or negative?",
            "response": ANSWERS[row["label"]],
        }
        for row in chosen
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/instructions-sst2-data"))
    parser.add_argument("--train", type=int, default=4096)
    parser.add_argument("--test", type=int, default=500)
    args = parser.parse_args()
    sst2 = Path(os.environ["SEEDFLOOD_DATA_DIR"]) / "sst2"
    args.out.mkdir(parents=True, exist_ok=True)
    for name, source, count in (
        ("train", sst2 / "train.jsonl", args.train),
        ("test", sst2 / "validation.jsonl", args.test),
    ):
        rows = instructions(source, count, seed=0)
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {args.out / f'{name}.jsonl'}")


if __name__ == "__main__":
    main()
