"""Run configurations: plain data, loaded from YAML, overridable from the command line.

Every key is validated up front so that a typo or an impossible value fails in the first second
with the key's name and what is allowed, not after the model has loaded.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from seedflood.learning.schedules import EPS_SCHEDULES, SCHEDULES
from seedflood.learning.tasks import TASKS, TaskSpec
from seedflood.protocol.guard import GUARD_DRIFT, GUARD_FACTOR
from seedflood.topology import TOPOLOGIES, TopologyError, check_parameters

METHODS: tuple[str, ...] = ("seedflood", "dsgd", "choco", "dzsgd")
GOSSIP_LOCAL_STEPS = 5


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who wrote the config."""


def _batchable(method: str, direction: str, lora: bool) -> bool:
    """Batched forwards need clients that differ from a shared model in a way a forward can add
    row by row: SubCGE's few rows per matrix, or LoRA adapters under a zeroth-order method."""
    return (method == "seedflood" and direction == "subcge") or (method == "dzsgd" and lora)


class RunConfig(BaseModel):
    """One training run. Defaults follow the paper where it states them."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str = "smollm2-135m"
    task: str | TaskSpec = "sst2"
    data_dir: str | None = None
    n_train: int = Field(1024, ge=1)
    n_val: int = Field(500, ge=1)
    n_test: int = Field(1000, ge=1)
    partition: Literal["uniform", "dirichlet"] = "uniform"
    alpha: float = Field(0.5, gt=0)
    max_length: int = Field(256, ge=8)

    clients: int = Field(16, ge=2)
    topology: Literal[TOPOLOGIES] = "ring"  # type: ignore[valid-type]
    topology_degree: int = Field(3, ge=1)
    topology_p: float | None = Field(None, gt=0, le=1)
    edgelist: str | None = None

    method: Literal[METHODS] = "seedflood"  # type: ignore[valid-type]
    label: str | None = None
    direction: Literal["subcge", "dense"] = "subcge"
    rank: int = Field(32, ge=1)
    refresh: int = Field(1000, ge=1)
    eps: float = Field(1e-3, gt=0)
    lr: float = Field(3e-3, gt=0)
    lr_schedule: Literal[SCHEDULES] = "constant"  # type: ignore[valid-type]
    warmup_steps: int = Field(0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    eps_schedule: Literal[EPS_SCHEDULES] = "constant"  # type: ignore[valid-type]
    batch_size: int = Field(16, ge=1)
    rounds: int = Field(100, ge=1)
    local_steps: int | None = Field(None, ge=1)
    hops: int | None = Field(None, ge=1)
    scalar_format: Literal["fp32", "fp16", "bf16"] = "fp32"
    # The precision the forwards (loss evaluations and evaluation) compute in, through
    # torch.autocast; weights, perturbations and message application stay fp32, so the clients
    # of a run stay bit-identical (seedflood.learning.precision).
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    batched_forward: bool = True
    staleness: int = Field(0, ge=0)
    hash_every: int = Field(10, ge=1)
    snapshot_every: int = Field(100, ge=1)

    link_loss: float = Field(0.0, ge=0, lt=1)
    link_duplicate: float = Field(0.0, ge=0, le=1)
    link_reorder: float = Field(0.0, ge=0, le=1)
    link_delay: float = Field(0.0, ge=0, le=1)
    link_delay_hops: int = Field(1, ge=1)
    link_seed: int = Field(0, ge=0, lt=2**63)
    cut_rounds: tuple[int, int] | None = None
    cut_edges: tuple[tuple[int, int], ...] | None = None
    repair_exchanges: int = Field(64, ge=0)
    clip_multiple: float | None = Field(None, gt=0)
    # The divergence guard (seedflood.protocol.guard): stop before a step whose mean |scalar|
    # exceeds guard_factor × the median of the last guard_window steps (a spike), or whose
    # guard_drift_window-step median exceeds guard_drift × the lowest such median (a drift).
    # DZSGD is guarded on its clients' scalars too, and stops after the round of such a step.
    # guard_factor: null turns the guard off, guard_drift: null its drift rule.
    guard_factor: float | None = Field(GUARD_FACTOR, gt=1)
    guard_window: int = Field(100, ge=1)
    guard_warmup: int = Field(20, ge=1)
    guard_drift: float | None = Field(GUARD_DRIFT, gt=1)
    guard_drift_window: int = Field(50, ge=1)
    clip_window: int = Field(8, ge=1)
    attackers: int = Field(0, ge=0)
    attack_factor: float = 1000.0

    lora: bool = False
    lora_rank: int = Field(8, ge=1)
    lora_alpha: float = Field(16.0, gt=0)
    lora_targets: tuple[str, ...] = Field(("q_proj", "v_proj"), min_length=1)
    mixing: Literal["metropolis", "uniform"] = "metropolis"
    topk_ratio: float = Field(0.03, gt=0, le=1)
    gamma: float = Field(0.5, gt=0, le=1)

    # The trained model in OUT/model (a grid of SmolLM2 runs takes 0.5 GB a run; a SeedFlood
    # run's model can be rebuilt from its ledger with `seedflood replay` either way).
    save_model: bool = True
    eval_every: int = Field(10, ge=1)
    eval_examples: int | None = Field(None, ge=1)
    # Clamped to clients where used, not refused: the default of 4 must fit every run of 2 or 3.
    eval_clients: int = Field(4, ge=1)
    eval_batch_size: int = Field(32, ge=1)
    # Below 2^63: derived seeds pack it as a signed 64-bit integer.
    seed: int = Field(0, ge=0, lt=2**63)

    @field_validator("task", mode="before")
    @classmethod
    def _known_task(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in TASKS:
            raise ValueError(
                f"unknown task {value!r}; allowed: {', '.join(TASKS)}, or a mapping for your "
                "own data (data:, template:, labels: …; see README, 'Fine-tune your own model')"
            )
        return value

    @property
    def task_name(self) -> str:
        """The task as reports name it: the built-in's name, or the user task's name."""
        return self.task if isinstance(self.task, str) else self.task.task_name

    @model_validator(mode="before")
    @classmethod
    def _batched_where_possible(cls, data: Any) -> Any:
        """batched_forward defaults to on wherever it applies: benchmarks/forward.py measured
        2.6x the client-steps per second of one client at a time (128 SeedFlood clients of
        SmolLM2-135M)."""
        if isinstance(data, dict) and data.get("batched_forward") is None:
            batchable = _batchable(
                data.get("method", "seedflood"),
                data.get("direction", "subcge"),
                bool(data.get("lora", False)),
            )
            data = {**data, "batched_forward": batchable}
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """YAML reads yes/no/on/off as booleans and pydantic would take them as 1 and 0: a typo
        that silently becomes one client or one round."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if isinstance(value, bool) and field is not None and field.annotation is not bool:
                    raise ValueError(f"key '{key}' is not a boolean (got {value!r})")
        return data

    @model_validator(mode="after")
    def _sizes_fit(self) -> RunConfig:
        if self.n_train < self.clients:
            raise ValueError(
                f"keys 'n_train' ({self.n_train}) and 'clients' ({self.clients}): every client "
                "needs at least one training example; raise n_train or lower clients"
            )
        try:
            check_parameters(
                self.topology, self.clients, degree=self.topology_degree, p=self.topology_p
            )
        except TopologyError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _cut_is_possible(self) -> RunConfig:
        if self.cut_rounds is not None:
            start, end = self.cut_rounds
            if not 0 <= start < end:
                raise ValueError(
                    f"key 'cut_rounds' is [start, end] rounds with 0 <= start < end "
                    f"(got {list(self.cut_rounds)})"
                )
        for a, b in self.cut_edges or ():
            if a == b or not (0 <= a < self.clients and 0 <= b < self.clients):
                raise ValueError(
                    f"key 'cut_edges' holds pairs [a, b] of two different clients, "
                    f"0 <= a, b < clients ({self.clients}) (got {[a, b]})"
                )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.topology == "edgelist" and not self.edgelist:
            raise ValueError("topology 'edgelist' needs the key 'edgelist': a path to an edge file")
        if self.batched_forward and not _batchable(self.method, self.direction, self.lora):
            raise ValueError(
                "batched_forward needs method seedflood with direction subcge, or method dzsgd "
                "with lora: true"
            )
        if self.dtype == "fp16" and self.method in ("dsgd", "choco"):
            raise ValueError(
                f"dtype fp16 with method {self.method}: fp16 gradients underflow without loss "
                "scaling, which seedflood does not do; use dtype bf16"
            )
        if self.lora and self.method == "seedflood":
            raise ValueError(
                "lora: true applies to the gossip baselines (dsgd, choco, dzsgd); SeedFlood "
                "trains the weight matrices through SubCGE or dense directions"
            )
        if self.attackers and (self.method != "seedflood" or self.attackers >= self.clients):
            raise ValueError(
                f"attackers ({self.attackers}) simulates poisoning SeedFlood clients: it needs "
                f"method seedflood and fewer attackers than clients ({self.clients})"
            )
        if self.guard_warmup > self.guard_window:
            raise ValueError(
                f"key 'guard_warmup' ({self.guard_warmup}) must be at most guard_window "
                f"({self.guard_window}): the guard's median is over that window"
            )
        steps = self.rounds * self.steps_per_round
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError(
                f"keys 'warmup_steps' ({self.warmup_steps}) and 'warmup_ratio' "
                f"({self.warmup_ratio}) both set the warm-up: give one"
            )
        if self.warmup_steps >= steps:
            raise ValueError(
                f"key 'warmup_steps' ({self.warmup_steps}) must be below the run's steps "
                f"(rounds × local steps = {steps})"
            )
        return self

    @property
    def warmup(self) -> int:
        """Warm-up steps: ``warmup_steps``, or ``warmup_ratio`` of the run's steps rounded up (as
        transformers' TrainingArguments does) and short of the last step, so one config warms up
        in proportion at any length, a one-step run included."""
        if self.warmup_ratio:
            steps = self.rounds * self.steps_per_round
            return min(math.ceil(self.warmup_ratio * steps), steps - 1)
        return self.warmup_steps

    @property
    def steps_per_round(self) -> int:
        """``local_steps``, defaulting to 1 for SeedFlood and to the paper's 5 local updates
        between communications for the gossip baselines."""
        if self.local_steps is not None:
            return self.local_steps
        return 1 if self.method == "seedflood" else GOSSIP_LOCAL_STEPS

    @property
    def name(self) -> str:
        """What reports call this run's method: the label, else e.g. 'choco-lora'."""
        return self.label or (f"{self.method}-lora" if self.lora else self.method)

    def resolved_data_dir(self) -> str | None:
        """The data directory: the config's, else $SEEDFLOOD_DATA_DIR, else None (the hub)."""
        return self.data_dir or os.environ.get("SEEDFLOOD_DATA_DIR") or None


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"])
        if item["type"] == "extra_forbidden":
            allowed = ", ".join(RunConfig.model_fields)
            lines.append(f"unknown key '{key}'. Allowed keys: {allowed}")
        elif not key:
            # A check across keys: its text names them, and the input is the whole config.
            lines.append(str(item.get("ctx", {}).get("error", item["msg"])))
        else:
            message = item.get("ctx", {}).get("error", item["msg"])
            lines.append(f"key '{key}': {message} (got {item.get('input')!r})")
    return "invalid run config:\n  " + "\n  ".join(lines)


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with the value read as YAML, so numbers and nulls keep their types."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def load_config(
    path: str | os.PathLike | None,
    overrides: list[str] | tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
) -> RunConfig:
    """Read a YAML config (or start from the defaults), then apply ``values`` and ``key=value``
    overrides, in that order."""
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            loaded = yaml.safe_load(file.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{file} must hold a mapping of keys to values")
        data.update(loaded or {})
    data.update(values or {})
    data.update(parse_override(o) for o in overrides)
    try:
        return RunConfig(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
