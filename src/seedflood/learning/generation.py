"""Greedy decoding of the test completions, for a user to read what a language-modelling run
writes (``eval_generate: true``).

An evaluation already counts exact greedy completions from one forward pass per batch (every
completion token is the argmax after the tokens before it); generating with transformers says the
same thing through the path a user would take, and shows the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from seedflood.learning.scoring import TokenizedExample


def greedy_generations(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[TokenizedExample],
) -> list[dict[str, Any]]:
    """Per example: the prompt, the expected and the generated completion (as many tokens as the
    expected one), and whether they match token for token."""
    rows = []
    with torch.inference_mode():
        for example in examples:
            (expected,) = example.candidates
            prompt = torch.tensor([example.prompt], device=model.device)
            generated = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=len(expected),
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(example.prompt) :].tolist()
            rows.append(
                {
                    "prompt": tokenizer.decode(example.prompt, skip_special_tokens=True),
                    "expected": tokenizer.decode(expected),
                    "generated": tokenizer.decode(generated),
                    "match": tuple(generated) == expected,
                }
            )
    return rows
