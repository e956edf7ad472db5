"""config → model, tokenizer, task data, topology, client shards and direction: where both
runners start.

The simulator builds every client's shard and hands them to an algorithm; a real peer builds the
same parts but tokenizes only its own shard. Both draw the same data, shards, weights and
direction from the same config, which is what lets a peer's committed model equal the
simulator's bit for bit.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from seedflood.config import ConfigError, RunConfig
from seedflood.learning.models import load_model
from seedflood.learning.precision import autocasts, forward_precision
from seedflood.learning.scoring import TokenizedExample, tokenize
from seedflood.learning.tasks import Example, TaskData, load_task, partition
from seedflood.topology import Topology, make_topology
from seedflood.zo import DenseDirection, SubCGEDirection, make_direction


@dataclass
class Parts:
    """What a run is made of before any method touches it. Every client's shard is drawn, but
    tokenized only when asked for (`shard`), so a peer pays only for its own."""

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    topology: Topology
    examples: list[list[Example]]
    val: list[TokenizedExample]
    test: list[TokenizedExample]
    data_notes: list[str]
    data_source: str
    data_identity: dict[str, int | str]
    max_length: int

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def shard(self, client: int) -> list[TokenizedExample]:
        """Client ``client``'s training examples, tokenized."""
        return tokenize(self.tokenizer, self.examples[client], self.max_length)


def run_topology(config: RunConfig) -> Topology:
    return make_topology(
        config.topology,
        config.clients,
        seed=config.seed,
        degree=config.topology_degree,
        p=config.topology_p,
        path=config.edgelist,
    )


def run_data(config: RunConfig) -> TaskData:
    """The run's train, validation and test examples, drawn by its seed."""
    return load_task(
        config.task,
        data_dir=config.resolved_data_dir(),
        seed=config.seed,
        n_train=config.n_train,
        n_val=config.n_val,
        n_test=config.n_test,
    )


def build_parts(config: RunConfig, device: torch.device | None = None) -> Parts:
    """The run's parts with its model on ``device`` (the CPU by default); call it inside ``with
    device:`` so that the tensors a method creates later land there too."""
    topology = run_topology(config)  # first: a bad graph is refused before any loading
    data = run_data(config)
    model, tokenizer = load_model(config.model, seed=config.seed)
    model.to(device or torch.device("cpu"))
    return Parts(
        model=model,
        tokenizer=tokenizer,
        topology=topology,
        examples=partition(
            data.train,
            config.clients,
            seed=config.seed,
            scheme=config.partition,
            alpha=config.alpha,
        ),
        val=tokenize(tokenizer, data.val[: config.eval_examples or None], config.max_length),
        test=tokenize(tokenizer, data.test, config.max_length),
        data_notes=list(data.notes),
        data_source=data.source,
        data_identity=data.identity(),
        max_length=config.max_length,
    )


def run_direction(config: RunConfig, model: nn.Module) -> DenseDirection | SubCGEDirection:
    """The directions SeedFlood's messages name, over ``model``'s parameters."""
    return make_direction(
        config.direction, model, rank=config.rank, refresh=config.refresh, run_seed=config.seed
    )


DEVICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


def compute_device(name: str, *, setting: str, on_cpu: str) -> torch.device:
    """The device ``name`` names, checked before any work: the simulator's $SEEDFLOOD_DEVICE and
    a peer's --device both end here, so the two runners compute where the same name says.
    'auto' is the first GPU where torch sees one, else the CPU. ``setting`` is how the user
    named the device (for the messages) and ``on_cpu`` how they would ask for the CPU instead."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{setting}={name!r} is not a device; use {DEVICES}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"{setting}={name!r}: seedflood computes on {DEVICES}")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{setting}={name!r}, but this torch ({torch.__version__}) sees no CUDA GPU; {on_cpu}"
        )
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        raise ConfigError(f"{setting}={name!r}, but only cuda:0 to cuda:{count - 1} exist")
    return device


def on_device(device: torch.device) -> AbstractContextManager[object]:
    """Make the tensors created inside land on ``device``. Where that is torch's default device
    already (the CPU, as a rule) no ``torch.device`` context is entered: that context sends every
    torch call through a Python handler, which cost 4 µs an operation here and made the tiny
    model's forward 35% slower."""
    return nullcontext() if device == torch.get_default_device() else device


def run_precision(config: RunConfig, device: torch.device) -> AbstractContextManager[None]:
    """The config's forward precision for every forward inside, refused up front where this
    torch cannot autocast to it on ``device`` (autocast would only warn and compute in fp32)."""
    if not autocasts(config.dtype, device):
        raise ConfigError(
            f"key 'dtype': this torch ({torch.__version__}) cannot compute {config.dtype} "
            f"forwards on {device.type}; use dtype fp32"
            + (" or bf16" if autocasts("bf16", device) else "")
        )
    return forward_precision(config.dtype)
