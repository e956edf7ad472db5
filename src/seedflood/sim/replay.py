"""`seedflood replay` and `seedflood evaluate`: rebuild a run's model from its ledger alone, and
score any saved model on a task.

A replay loads the base model the manifest names, checks it is the one the run started from,
applies the logged messages with the run's update rule (rate schedule and clipping included) and
checks that it ends on the run's state hash; no data is read and no forward pass is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from seedflood.build import run_data, run_direction, run_precision
from seedflood.config import RunConfig
from seedflood.learning.models import load_model, save_model, state_hash
from seedflood.learning.schedules import lr_schedule
from seedflood.learning.scoring import evaluation, tokenize
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.ledger import LedgerError, apply_log, read_ledger


def replay(run_dir: Path, out: Path | None = None) -> dict[str, Any]:
    """What ``rebuild`` checked."""
    return rebuild(run_dir, out)[1]


def rebuild(run_dir: Path, out: Path | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The model of the run in ``run_dir`` rebuilt from its ledger (saved to ``out`` when given),
    and what was checked. Raises LedgerError where the base model or the end state differ."""
    manifest, messages = read_ledger(run_dir)
    config = RunConfig(**manifest["update"])
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(config.model, seed=config.seed)
    direction = run_direction(config, model)
    base = state_hash(direction.tensors)
    if base != manifest["base_hash"]:
        raise LedgerError(
            f"the base model {config.model!r} loaded here hashes to {base[:16]}…, not the run's "
            f"{manifest['base_hash'][:16]}…: replay needs the model the run started from"
        )
    apply_log(
        direction,
        messages,
        run_seed=config.seed,
        lr=lr_schedule(config),
        clients=config.clients,
        clip=ScalarClip.from_config(config),
    )
    final = state_hash(direction.tensors)
    if final != manifest["state_hash"]:
        raise LedgerError(
            f"replaying {len(messages)} messages ends on {final[:16]}…, not on the run's "
            f"{manifest['state_hash'][:16]}…"
        )
    if out is not None:
        save_model(model, tokenizer, out)
    return model, {"messages": len(messages), "state_hash": final, "model_dir": str(out or "")}


def evaluate(model_dir: str, config: RunConfig) -> dict[str, Any]:
    """Test accuracy and loss of the model in ``model_dir`` (or any name `load_model` takes) on
    ``config``'s task, with the test set, scoring and forward precision a run of ``config``
    uses."""
    model, tokenizer = load_model(model_dir, seed=config.seed)
    test = tokenize(tokenizer, run_data(config).test, config.max_length)
    with run_precision(config, torch.device("cpu")):
        scored = evaluation(model, test, tokenizer.pad_token_id, config.eval_batch_size)
    language_model = {} if scored.perplexity is None else {"perplexity": scored.perplexity}
    return {
        "accuracy": scored.accuracy,
        "eval_loss": scored.loss,
        **language_model,
        "test_examples": len(test),
        "task": config.task_name,
    }
