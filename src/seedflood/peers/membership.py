"""Who takes part in a run: peers announce themselves in hivemind's DHT under the run id.

Every peer stores a record under the key ``seedflood/<run id>/members``, its peer id as subkey,
with the time it joined, its client index (-1 until it has one), whether it has finished, its
public signing key (hex; a fourth field, so records of older peers still parse) and its shared
config (`seedflood.peers.admission`; a fifth), and renews it before it expires. The key is how
the initial members learn each other's keys; joiners' keys travel in their signed admissions. A
peer that stops renewing (it left or crashed) drops out after ``ttl`` seconds. Every peer orders
the live records the same way, by (joined, peer id): the first ``clients`` peers of a run are its
initial members, in that order, and that list is published under ``seedflood/<run id>/initial``
so a peer that looks later reads it instead of guessing. Only peers with the run's shared config
count: a peer whose config differs is refused by name rather than drawn, and the run waits for
one that has it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seedflood.peers.admission import ConfigRecordError, SharedConfig
from seedflood.peers.crypto import parse_public

_SUBKEY = re.compile(r"(?P<peer>[1-9A-HJ-NP-Za-km-z]{1,128})\[owner:(?P<key>[0-9a-f]{64})\]")


class MembershipError(RuntimeError):
    """The membership did not reach the expected size in time."""


class AllowlistError(ValueError):
    """An allowlist file that is not one; the message names the file and the line."""


def read_allowlist(path: Path) -> frozenset[str]:
    """The public keys (hex) a run admits, one per line of ``path``; ``#`` starts a comment."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise AllowlistError(f"cannot read the allowlist {path}: {error}") from None
    keys = set()
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if parse_public(text) is None:
            raise AllowlistError(
                f"{path}, line {number}: {text[:70]!r} is not an Ed25519 public key "
                "(64 hex digits, as `seedflood peer` prints and writes to STATE_DIR/public.key)"
            )
        keys.add(text.lower())
    if not keys:
        raise AllowlistError(f"the allowlist {path} names no key")
    return frozenset(keys)


def owned_subkey(peer_id: str, key_hex: str) -> str:
    return f"{peer_id}[owner:{key_hex}]"


def split_subkey(subkey: object) -> tuple[str, str] | None:
    """(peer id, owner key hex) of an owned subkey; None for anything else."""
    if not isinstance(subkey, str):
        return None
    match = _SUBKEY.fullmatch(subkey)
    return None if match is None else (match["peer"], match["key"])


def _peer_of(subkey: object) -> tuple[str, str]:
    """(peer id, key) a record's subkey names: an owned subkey's owner, or a bare peer id (a
    record of a node without the validator, which honest peers' DHT nodes refuse to hold)."""
    owned = split_subkey(subkey)
    if owned is not None:
        return owned
    return (subkey, "") if isinstance(subkey, str) else ("", "")


def check_run_id(run_id: str) -> None:
    if not run_id or "/" in run_id:
        raise ValueError(f"run id must be a non-empty name without '/'; got {run_id!r}")


@dataclass(frozen=True, order=True)
class Member:
    joined: float
    peer_id: str
    index: int = -1
    done: bool = False
    key: str = ""
    config: SharedConfig | None = field(default=None, compare=False)


def run_config(members: list[Member], besides: str = "") -> SharedConfig | None:
    """The run's shared config: its lowest-indexed seated member's, or, before anyone is seated,
    the one of the earliest member to announce one (the run is what its first peer started),
    leaving out the peer ``besides``. Records without one (older peers) have no say."""
    known = [m for m in members if m.config is not None and m.peer_id != besides]
    if not known:
        return None
    return min(known, key=lambda m: (m.index < 0, m.index, m.joined, m.peer_id)).config


class Membership:
    """This peer's announcement and its view of everyone else's, for one run."""

    def __init__(
        self,
        dht: Any,
        run_id: str,
        ttl: float = 30.0,
        joined: float | None = None,
        key: str = "",
        config: SharedConfig | None = None,
    ) -> None:
        check_run_id(run_id)
        if ttl <= 0:
            raise ValueError(f"ttl must be positive; got {ttl}")
        from hivemind.utils import get_dht_time

        self._now = get_dht_time
        self.dht = dht
        self.key = f"seedflood/{run_id}/members"
        self.initial_key = f"seedflood/{run_id}/initial"
        self.ttl = ttl
        self.me = Member(
            self._now() if joined is None else joined,
            dht.peer_id.to_base58(),
            key=key,
            config=config,
        )
        self.subkey = owned_subkey(self.me.peer_id, key) if key else self.me.peer_id
        self.initial_ids: list[str] = []

    def announce(self, index: int = -1, done: bool = False) -> bool:
        """Store (or renew) this peer's record; call it more often than every ``ttl`` seconds.
        Whether a DHT node took it: none may while the network is still forming or already
        gone, and the next renewal tries again."""
        record = [self.me.joined, index, done, self.me.key]
        if self.me.config is not None:
            record.append(self.me.config.to_record())
        stored = self.dht.store(
            self.key,
            record,
            expiration_time=self._now() + self.ttl,
            subkey=self.subkey,
        )
        if stored and self.initial_ids:
            self._publish_initial()
        return bool(stored)

    def _publish_initial(self) -> None:
        """Every peer that knows the initial list keeps it alive, as it does its own record, under
        its own subkey: no node can rewrite another's copy."""
        self.dht.store(
            self.initial_key,
            self.initial_ids,
            expiration_time=self._now() + self.ttl,
            subkey=self.subkey,
        )

    def _published(self) -> list[str] | None:
        """The initial list most of its own members vouch for: a copy counts only when its
        publisher is in it, so a stranger's list counts only as much as the strangers in it."""
        found = self.dht.get(self.initial_key, latest=True)
        if found is None or not isinstance(found.value, dict):
            return None
        votes: dict[tuple[str, ...], int] = {}
        for subkey, record in found.value.items():
            publisher, _ = _peer_of(subkey)
            ids = record.value
            if isinstance(ids, list) and all(isinstance(p, str) for p in ids) and publisher in ids:
                votes[tuple(ids)] = votes.get(tuple(ids), 0) + 1
        if not votes:
            return None
        return list(max(votes, key=lambda ids: (votes[ids], ids)))

    def members(self) -> list[Member]:
        """The live members, in the order every peer agrees on; a record that no honest peer
        stores (a bad config among them) is left out."""
        found = self.dht.get(self.key, latest=True)
        if found is None or not isinstance(found.value, dict):
            return []
        live = []
        for subkey, record in found.value.items():
            peer_id, owner = _peer_of(subkey)
            value = record.value
            if (
                peer_id
                and isinstance(value, list)
                and len(value) in (3, 4, 5)
                and isinstance(value[0], (int, float))
                and isinstance(value[1], int)
            ):
                key = owner or (value[3] if len(value) >= 4 and isinstance(value[3], str) else "")
                try:
                    config = SharedConfig.read(value[4]) if len(value) == 5 else None
                except ConfigRecordError:
                    continue
                live.append(Member(float(value[0]), peer_id, value[1], bool(value[2]), key, config))
        return sorted(live)

    def initial(self, clients: int, timeout: float, poll: float = 0.2) -> list[str]:
        """The run's initial members' peer ids, in client order: the published list, or else
        the first ``clients`` peers with the run's shared config to announce themselves, which
        this call then publishes. Raises ConfigDiffers, naming the keys, when this peer's
        config is not the run's."""
        deadline = time.monotonic() + timeout
        while True:
            published = self._published()
            if published is not None:
                self.initial_ids = published
                return self.initial_ids
            live = self.members()
            run = run_config(live)
            if run is not None:
                if self.me.config is not None:
                    self.me.config.check(run)
                live = [m for m in live if m.config == run]
            if len(live) >= clients:
                self.initial_ids = [m.peer_id for m in live[:clients]]
                self._publish_initial()
                return self.initial_ids
            if time.monotonic() > deadline:
                raise MembershipError(
                    f"{len(live)} of {clients} peers announced themselves under {self.key} "
                    f"within {timeout:g} s"
                )
            time.sleep(poll)
