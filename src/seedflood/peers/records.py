"""Run records in the DHT that only their owner can write, and only allowed owners at all.

hivemind's DHT stores whatever any node asks it to: without a validator one node overwrote a
member's record with another key and a 24-hour expiry, added members that joined "at time 0",
and rewrote the initial member list that new peers read. `OwnedRecords` is a hivemind record
validator, in the manner of its `RSASignatureValidator` but with the Ed25519 key that already
signs the peer's batches: a run record's subkey names its owner (``<peer id>[owner:<key hex>]``),
its value ends with the owner's signature over key, subkey, value and expiry, and honest nodes
refuse to store, or to return, a record whose signature fails, whose owner the run's allowlist
does not name, whose shape is not a run record's, or that would outlive ``MAX_RECORD_SECONDS``.

A valid signature proves the owner wrote the record, not that the peer id in the subkey is the
owner's: the join handler binds peer ids to callers (libp2p authenticates the caller), and an
allowlist is what keeps strangers' keys out of a run altogether (docs/peers.md, "Trust model").
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer

from seedflood.peers.crypto import SIGNATURE_BYTES, parse_public, public_hex
from seedflood.peers.membership import split_subkey

__all__ = ["MAX_RECORD_SECONDS", "OwnedRecords", "record_key_ids"]

MAX_RECORD_SECONDS = 600.0
"""How far ahead of now a run record may expire: peers renew theirs every few seconds, so a
longer life only serves a record that should have died with its peer."""

_SIGNED = b"[ed25519:"
_TAIL = len(_SIGNED) + SIGNATURE_BYTES + 1
_MAX_VALUE_BYTES = 4096


def record_key_ids(run_id: str) -> dict[bytes, str]:
    """The DHT's hashed ids of a run's two record keys, by name: a validator sees only ids."""
    return {
        DHTID.generate(source=f"seedflood/{run_id}/{name}").to_bytes(): name
        for name in ("members", "initial")
    }


def _member_value(value: Any, owner: str) -> bool:
    """[joined, index, done, key, config?]: the key must be the owner's own."""
    return (
        isinstance(value, list)
        and len(value) in (4, 5)
        and isinstance(value[0], (int, float))
        and not isinstance(value[0], bool)
        and math.isfinite(value[0])
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
        and -1 <= value[1] < 2**31
        and isinstance(value[2], bool)
        and value[3] == owner
        and (len(value) == 4 or isinstance(value[4], dict))
    )


def _initial_value(value: Any) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= 4096
        and all(isinstance(p, str) and len(p) <= 128 for p in value)
    )


class OwnedRecords(RecordValidatorBase):
    """Signs this peer's run records and refuses anyone's invalid ones; see the module."""

    def __init__(
        self,
        run_id: str,
        signing_key: Ed25519PrivateKey,
        allowed: Iterable[str] | None = None,
    ) -> None:
        self.run_id = run_id
        self._private = signing_key.private_bytes_raw()
        self.allowed = None if allowed is None else frozenset(allowed)
        self._setup()

    def _setup(self) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(self._private)
        self.owner = public_hex(self._key)
        self._ids = record_key_ids(self.run_id)

    def __getstate__(self) -> dict[str, Any]:
        """hivemind runs its DHT in a child process and pickles the validators to it."""
        return {"run_id": self.run_id, "private": self._private, "allowed": self.allowed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.run_id, self._private, self.allowed = (
            state["run_id"],
            state["private"],
            state["allowed"],
        )
        self._setup()

    def _serialized(self, record: DHTRecord) -> bytes:
        return MSGPackSerializer.dumps(dataclasses.astuple(record))

    def sign_value(self, record: DHTRecord) -> bytes:
        if record.key not in self._ids or f"[owner:{self.owner}]".encode() not in record.subkey:
            return record.value
        signature = self._key.sign(self._serialized(record))
        return record.value + _SIGNED + signature + b"]"

    def strip_value(self, record: DHTRecord) -> bytes:
        if record.key not in self._ids or not record.value.endswith(b"]"):
            return record.value
        return record.value[:-_TAIL]

    def validate(self, record: DHTRecord) -> bool:
        name = self._ids.get(record.key)
        if name is None:
            return True  # not this run's record: another validator's business, or none's
        try:
            return self._valid(name, record)
        except Exception:  # a record is hostile input: anything that fails to parse is invalid
            return False

    def _valid(self, name: str, record: DHTRecord) -> bool:
        value = record.value
        if (
            len(value) > _MAX_VALUE_BYTES
            or record.expiration_time > time.time() + MAX_RECORD_SECONDS
            or value[-_TAIL : -_TAIL + len(_SIGNED)] != _SIGNED
            or not value.endswith(b"]")
        ):
            return False
        owned = split_subkey(MSGPackSerializer.loads(record.subkey))
        if owned is None or (self.allowed is not None and owned[1] not in self.allowed):
            return False
        public = parse_public(owned[1])
        stripped = dataclasses.replace(record, value=value[:-_TAIL])
        try:
            public.verify(value[-SIGNATURE_BYTES - 1 : -1], self._serialized(stripped))
        except InvalidSignature:
            return False
        content = MSGPackSerializer.loads(stripped.value)
        return _member_value(content, owned[1]) if name == "members" else _initial_value(content)

    @property
    def priority(self) -> int:
        return 10  # like RSASignatureValidator: validate before, sign after, any other validator

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
