"""The part of the run config every peer of a run must share, and how peers compare it.

Peers apply each other's messages, so a peer whose config differs where it matters does not just
train worse: it trains another model, and the committed-state hashes only say so rounds later.
Each peer therefore publishes its `SharedConfig` (the values and their digest) in its membership
record and in its join request, and a peer whose digest is not the run's is refused before its
first step, by name of the keys that differ.

What is shared: the ledger's update record (`seedflood.protocol.ledger.update_record`: what a
message does to the model, local steps and warm-up resolved), and `PEER_KEYS`:

- the divergence guard's keys: the guard decides whether a step is committed at all, so peers
  that disagree stop at different steps;
- eps, eps_schedule, batch_size, dtype (the forwards' precision), staleness, and task, n_train,
  partition, alpha, max_length (which decide each client's shard): they shape the scalar a client
  computes, so that a run of real peers is the run its config describes (and the simulator
  reproduces);
- topology: each peer lays the run's topology over the live members to find its neighbours (by
  name and seed alone), and peers that disagree push along edges the other end does not keep.

Not shared: what stays on one machine (data_dir, evaluation, snapshots, save_model), the hash
cross-check's period (hash_every: peers that differ check less often, not differently), and what
only the simulator reads (link faults, hops, attackers, batched_forward, the gossip methods' keys).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from seedflood.config import ConfigError
from seedflood.protocol.ledger import update_record

if TYPE_CHECKING:
    from seedflood.config import RunConfig

__all__ = ["PEER_KEYS", "ConfigDiffers", "ConfigRecordError", "SharedConfig", "digest_of"]

PEER_KEYS: tuple[str, ...] = (
    "guard_factor",
    "guard_window",
    "guard_warmup",
    "guard_drift",
    "guard_drift_window",
    "eps",
    "eps_schedule",
    "batch_size",
    "dtype",
    "staleness",
    "task",
    "n_train",
    "partition",
    "alpha",
    "max_length",
    "topology",
)
MAX_KEYS = 64
MAX_TEXT = 200
_DIGEST = re.compile(r"[0-9a-f]{64}")


class ConfigDiffers(ConfigError):
    """This peer's config is not the run's: it is refused before its first step."""


class ConfigRecordError(ValueError):
    """A config record from another peer that no honest peer sends."""


def digest_of(values: object) -> str:
    """sha256 of canonical JSON (sorted keys, no spaces, shortest float repr): the same bytes on
    every peer, whatever order its config or a record listed the keys in."""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _plain(value: object) -> bool:
    """A value a config key of the shared part can hold: records come from other peers, so
    anything else (nested, long, huge, infinite) is refused before it is hashed or printed."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < 2**64
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _shareable(value: object) -> object:
    """A value as a record carries it: plain ones as they are, anything larger (a user task's
    mapping, a long model path) by its digest, which keeps records small and within what a peer
    accepts, and still tells equal from different."""
    return value if _plain(value) else "sha256:" + digest_of(value)


@dataclass(frozen=True)
class SharedConfig:
    """The shared part of one peer's config and its digest (sha256 of canonical JSON)."""

    values: dict[str, Any]
    digest: str

    @classmethod
    def of(cls, config: RunConfig) -> SharedConfig:
        dump = config.model_dump(mode="json")
        resolved = update_record(
            dump, local_steps=config.steps_per_round, warmup_steps=config.warmup
        )
        values = {
            key: _shareable(value)
            for key, value in {**resolved, **{key: dump[key] for key in PEER_KEYS}}.items()
        }
        return cls(values, digest_of(values))

    @classmethod
    def read(cls, record: object) -> SharedConfig:
        """The shared config in another peer's ``record`` (from `to_record`), or
        ConfigRecordError naming what is wrong with it."""
        if not isinstance(record, dict) or set(record) != {"digest", "values"}:
            raise ConfigRecordError("a config record is an object of 'digest' and 'values'")
        values, digest = record["values"], record["digest"]
        if not isinstance(values, dict):
            raise ConfigRecordError(f"config values are a {type(values).__name__}, not an object")
        if len(values) > MAX_KEYS:
            raise ConfigRecordError(f"config record of {len(values)} keys (at most {MAX_KEYS})")
        for key, value in values.items():
            if not isinstance(key, str) or len(key) > MAX_TEXT:
                raise ConfigRecordError(f"config key {str(key)[:MAX_TEXT]!r} is not a short name")
            if not _plain(value):
                raise ConfigRecordError(
                    f"config key {key!r} holds a {type(value).__name__} that is not a finite "
                    f"number, a string of at most {MAX_TEXT} characters or null"
                )
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ConfigRecordError("config digest is not 64 hex digits")
        if digest_of(values) != digest:
            raise ConfigRecordError("config digest does not match its values")
        return cls(dict(values), digest)

    def to_record(self) -> dict[str, Any]:
        return {"digest": self.digest, "values": self.values}

    def differences(self, run: SharedConfig) -> list[str]:
        """Each key whose value here is not the run's, with both values as JSON, which the
        digest hashes (so 1 and true differ here as they do there)."""
        mine, theirs = (
            {key: json.dumps(value) for key, value in shared.values.items()}
            for shared in (self, run)
        )
        return [
            f"{key} (run {theirs.get(key, 'absent')}, this peer {mine.get(key, 'absent')})"
            for key in sorted(mine.keys() | theirs.keys())
            if mine.get(key) != theirs.get(key)
        ]

    def check(self, run: SharedConfig) -> None:
        """Refuse this peer, by the keys that differ, unless its shared config is the run's."""
        if self.digest != run.digest:
            raise ConfigDiffers(
                "peer config differs from the run's: " + ", ".join(self.differences(run))
            )
