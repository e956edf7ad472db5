"""Who takes part in a run: peers announce themselves in hivemind's DHT under the run id.

Every peer stores a record under the key ``seedflood/<run id>/members``, its peer id as subkey,
with the time it joined, and renews it before it expires. A peer that stops renewing (it left or
crashed) drops out after ``ttl`` seconds. Every peer orders the live records the same way, by
(joined, peer id), so all agree on the membership list, and a client's index is its position: the
topology is built over that list. Late joiners sort last, so indices of earlier peers stay put.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


class MembershipError(RuntimeError):
    """The membership did not reach the expected size in time."""


@dataclass(frozen=True, order=True)
class Member:
    joined: float
    peer_id: str


class Membership:
    """This peer's announcement and its view of everyone else's, for one run."""

    def __init__(self, dht: Any, run_id: str, ttl: float = 30.0) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"run id must be a non-empty name without '/'; got {run_id!r}")
        if ttl <= 0:
            raise ValueError(f"ttl must be positive; got {ttl}")
        from hivemind.utils import get_dht_time

        self._now = get_dht_time
        self.dht = dht
        self.key = f"seedflood/{run_id}/members"
        self.ttl = ttl
        self.me = Member(self._now(), dht.peer_id.to_base58())

    def announce(self) -> None:
        """Store (or renew) this peer's record; call it more often than every ``ttl`` seconds."""
        stored = self.dht.store(
            self.key,
            self.me.joined,
            expiration_time=self._now() + self.ttl,
            subkey=self.me.peer_id,
        )
        if not stored:
            raise MembershipError(f"the DHT refused this peer's record under {self.key}")

    def members(self) -> list[Member]:
        """The live members, in the order every peer agrees on."""
        found = self.dht.get(self.key, latest=True)
        if found is None or not isinstance(found.value, dict):
            return []
        live = []
        for peer_id, record in found.value.items():
            if isinstance(peer_id, str) and isinstance(record.value, (int, float)):
                live.append(Member(float(record.value), peer_id))
        return sorted(live)

    def wait_for(self, count: int, timeout: float, poll: float = 0.2) -> list[Member]:
        """Block until at least ``count`` members are live, then return them."""
        deadline = time.monotonic() + timeout
        while True:
            live = self.members()
            if len(live) >= count:
                return live
            if time.monotonic() > deadline:
                raise MembershipError(
                    f"{len(live)} of {count} peers announced themselves under {self.key} within "
                    f"{timeout:g} s"
                )
            time.sleep(poll)
