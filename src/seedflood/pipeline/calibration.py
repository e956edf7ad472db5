"""What the pipeline simulator's compute costs are calibrated on: real stages, timed.

Simulated relays need a stage forward's wall time; it is measured on stages split from a
randomly initialised Llama of SmolLM2-135M's shape, since timing depends on layer sizes and not
on trained weights. Kept apart from stages.py, which is about splitting, serving and training.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from seedflood.learning.models import converted_model_dir
from seedflood.pipeline.stages import Stage


def measure_stage_seconds(stage: Stage, micro_batch: int, seq_len: int, repeats: int = 3) -> float:
    """Median wall time of one forward of `stage`, to calibrate the simulator's compute costs.

    Inputs are random ids or hidden states of the right shape, since cost does not depend on
    values. One untimed warm-up absorbs first-call allocation; autograd is off because the
    arithmetic is the same and the simulator derives the backward as a multiple of this.
    """
    if min(micro_batch, seq_len, repeats) < 1:
        raise ValueError("micro_batch, seq_len and repeats must all be >= 1")
    shape = (micro_batch, seq_len)
    ids = torch.randint(stage.config.vocab_size, shape, generator=torch.Generator().manual_seed(0))
    activations = (
        ids if stage.embed_tokens is not None else torch.randn(*shape, stage.config.hidden_size)
    )
    mask = torch.ones(micro_batch, seq_len, dtype=torch.long)
    timings = []
    with torch.no_grad():
        for attempt in range(repeats + 1):
            started = time.perf_counter()
            stage(activations, mask, ids)
            if attempt:
                timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def llama_from_smollm2(layers: int | None = None, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised Llama with SmolLM2-135M's shape, for pipeline experiments.

    Pipeline timing needs real layer sizes but not trained weights, so nothing is downloaded:
    the config saved next to the converted SmolLM2 is used when present, else SmolLM2-135M's
    published dimensions. Fewer layers make cheaper stages of the same width.
    """
    saved = converted_model_dir()
    if (saved / "config.json").is_file():
        config = LlamaConfig.from_pretrained(saved)
    else:
        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        )
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        config.num_hidden_layers = layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model.requires_grad_(False)
