"""Who said a scalar: Ed25519 keys per peer and signed batches of one origin's round.

A flooded scalar moves every client's model, so a peer accepts one only with its origin's
signature. Signing each message would cost 64 bytes on 5, so an origin signs its round: one
signature over the run's context, its index, the round's steps and scalars and the controls they
carry. The batch travels whole (a forwarder cannot split it) and the signature with it, so any
peer can check it however many hops it came; `seedflood.peers.inbox` decides what to do with it.

The context binds a signature to one run: its id and its genesis, the digest of its initial
members' peer ids. A batch signed for another context is a replay, never a message of this run,
even when a later run reuses the run id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from seedflood.peers.roster import Control
from seedflood.protocol.messages import Message

KEY_FILE = "signing.key"
KEY_BYTES = 32
SIGNATURE_BYTES = 64
_DOMAIN = b"seedflood/batch/1\0"
_HEAD = struct.Struct("<QQI")
_ENTRY = struct.Struct("<Qd")

Key = tuple[int, int]


class KeyFileError(RuntimeError):
    """A signing key file that is not one."""


def load_or_create_key(state_dir: Path) -> Ed25519PrivateKey:
    """This peer's key, created on first start. A restarted peer must sign with the key the others
    already hold, so the key lives in the state dir, written whole (temporary file, fsync,
    rename) and readable by its owner only."""
    path = state_dir / KEY_FILE
    if path.is_file():
        raw = path.read_bytes()
        if len(raw) != KEY_BYTES:
            raise KeyFileError(
                f"{path} holds {len(raw)} bytes; an Ed25519 key file holds exactly {KEY_BYTES}"
            )
        return Ed25519PrivateKey.from_private_bytes(raw)
    state_dir.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    temp = state_dir / f".{KEY_FILE}.{os.getpid()}.tmp"
    handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(handle, "wb") as file:
        file.write(key.private_bytes_raw())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    return key


def public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def parse_public(text: str) -> Ed25519PublicKey | None:
    """A public key from its hex form; None for anything else (a record is untrusted input)."""
    try:
        raw = bytes.fromhex(text)
    except (TypeError, ValueError):
        return None
    return Ed25519PublicKey.from_public_bytes(raw) if len(raw) == KEY_BYTES else None


_JOIN_DOMAIN = b"seedflood/join/1\0"


def _join_bytes(run_id: str, peer_id: str, key_hex: str) -> bytes:
    return _JOIN_DOMAIN + "\0".join((run_id, peer_id, key_hex)).encode()


def join_proof(key: Ed25519PrivateKey, run_id: str, peer_id: str) -> str:
    """A joiner's signature over the run, its peer id and its key: a seat is given only to a
    peer that holds the key it names, so no one can take a seat under someone else's key."""
    return base64.b64encode(key.sign(_join_bytes(run_id, peer_id, public_hex(key)))).decode()


def verify_join(key_hex: str, run_id: str, peer_id: str, proof: object) -> bool:
    public = parse_public(key_hex)
    if public is None or not isinstance(proof, str) or len(proof) > 2 * SIGNATURE_BYTES:
        return False
    try:
        public.verify(base64.b64decode(proof, validate=True), _join_bytes(run_id, peer_id, key_hex))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Context:
    """The run a signature belongs to."""

    run_id: str
    genesis: str

    @classmethod
    def of(cls, run_id: str, initial_peer_ids: Sequence[str]) -> Context:
        digest = hashlib.sha256("\n".join(initial_peer_ids).encode()).hexdigest()
        return cls(run_id, digest)

    def encode(self) -> bytes:
        run = self.run_id.encode()
        return struct.pack("<I", len(run)) + run + bytes.fromhex(self.genesis)


@dataclass
class SignedBatch:
    """One origin's messages of one round, what they carry, and the origin's signature."""

    origin: int
    round: int
    messages: tuple[Message, ...]
    controls: dict[Key, list[Control]] = field(default_factory=dict)
    signature: bytes = b""

    def signed_bytes(self, context: Context) -> bytes:
        out = bytearray(_DOMAIN + context.encode())
        out += _HEAD.pack(self.origin, self.round, len(self.messages))
        for message in self.messages:
            out += _ENTRY.pack(message.step, message.scalar)
        out += controls_bytes(self.controls)
        return bytes(out)

    def sign(self, key: Ed25519PrivateKey, context: Context) -> SignedBatch:
        self.signature = key.sign(self.signed_bytes(context))
        return self

    def verifies(self, public: Ed25519PublicKey, context: Context) -> bool:
        try:
            public.verify(self.signature, self.signed_bytes(context))
        except InvalidSignature:
            return False
        return True

    def same_content(self, other: SignedBatch) -> bool:
        return self.messages == other.messages and controls_bytes(self.controls) == controls_bytes(
            other.controls
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "o": self.origin,
            "r": self.round,
            "m": [[m.step, m.scalar] for m in self.messages],
            "c": controls_to_json(self.controls),
            "s": base64.b64encode(self.signature).decode(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SignedBatch:
        origin = int(data["o"])
        messages = tuple(Message(int(step), origin, float(scalar)) for step, scalar in data["m"])
        return cls(origin, int(data["r"]), messages, controls_from_json(data["c"]), b64(data["s"]))


def controls_to_json(controls: dict[Key, list[Control]]) -> list[Any]:
    return [[step, origin, entries] for (step, origin), entries in sorted(controls.items())]


def controls_from_json(data: Any) -> dict[Key, list[Control]]:
    try:
        return {(int(step), int(origin)): list(entries) for step, origin, entries in data or []}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad controls field: {exc}") from None


def controls_bytes(controls: dict[Key, list[Control]]) -> bytes:
    return json.dumps(controls_to_json(controls), sort_keys=True, separators=(",", ":")).encode()


def b64(text: Any) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"signature {str(text)[:20]!r} is not base64") from None


def group_batches(
    messages: Sequence[Message], controls: dict[Key, list[Control]], local_steps: int
) -> list[SignedBatch]:
    """Messages cut into (origin, round) batches in canonical order, each with its controls."""
    batches: dict[tuple[int, int], SignedBatch] = {}
    for message in sorted(messages):
        key = (message.origin, message.step // local_steps)
        batch = batches.setdefault(key, SignedBatch(*key, ()))
        batch.messages += (message,)
        if message.key in controls:
            batch.controls[message.key] = list(controls[message.key])
    return sorted(batches.values(), key=lambda b: (b.round, b.origin))
