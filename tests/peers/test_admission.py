"""The shared part of a run config: equal configs share a digest whatever they left to defaults,
a differing key is named with both values, a config record from another peer is checked before
use, and a sponsor refuses a joiner with another config before admitting anything."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from seedflood.config import load_config
from seedflood.peers.admission import (
    MAX_KEYS,
    ConfigDiffers,
    ConfigRecordError,
    SharedConfig,
    digest_of,
)
from seedflood.peers.batch_exchange import Exchange
from seedflood.peers.crypto import Context, join_proof, public_hex
from seedflood.peers.p2p import Frame, TransportError
from seedflood.peers.roster import Members, Seat
from seedflood.peers.state import NotAllowed
from seedflood.protocol.ledger import UPDATE_KEYS
from seedflood.ui import USER_ERRORS

BASE = ["model=tiny", "clients=2", "rounds=100", "lr=0.005", "lr_schedule=linear"]


def shared(*overrides: str) -> SharedConfig:
    return SharedConfig.of(load_config(None, [*BASE, *overrides]))


def test_equal_configs_share_a_digest_whatever_they_left_to_defaults_or_keep_local() -> None:
    run = shared()
    assert len(run.digest) == 64 and int(run.digest, 16) >= 0
    assert set(UPDATE_KEYS) | {"eps", "batch_size", "topology", "guard_factor"} <= set(run.values)
    assert run.values["local_steps"] == 1 and run.values["warmup_steps"] == 0
    # resolved values count, not how a config said them: local_steps left to SeedFlood's 1, and a
    # warm-up given as 10% of 100 steps is the warm-up of 10 steps
    assert shared("local_steps=1").digest == run.digest
    assert shared("warmup_ratio=0.1").digest == shared("warmup_steps=10").digest
    # what stays on one machine is not shared
    local = ["data_dir=/elsewhere", "n_test=7", "hash_every=3", "save_model=false", "eval_every=2"]
    assert shared(*local).digest == run.digest
    assert shared("lr=0.01").digest != run.digest


def test_a_differing_key_is_named_with_both_values() -> None:
    run, peer = shared(), shared("lr=0.01")
    assert peer.differences(run) == ["lr (run 0.005, this peer 0.01)"]
    with pytest.raises(ConfigDiffers) as refused:
        peer.check(run)
    named = "peer config differs from the run's: lr (run 0.005, this peer 0.01)"
    assert str(refused.value) == named
    assert isinstance(refused.value, USER_ERRORS)  # the CLI ends on it with exit code 2
    several = shared("lr=0.01", "batch_size=8", "topology=complete").differences(run)
    assert several == [
        "batch_size (run 16, this peer 8)",
        "lr (run 0.005, this peer 0.01)",
        'topology (run "ring", this peer "complete")',
    ]
    shared().check(run)  # the same config passes


def test_a_record_round_trips_and_a_missing_key_is_named() -> None:
    run = shared()
    assert SharedConfig.read(run.to_record()) == run
    values = {k: v for k, v in run.values.items() if k != "eps"}
    older = SharedConfig.read({"digest": digest_of(values), "values": values})
    assert older.differences(run) == ["eps (run 0.001, this peer absent)"]


def test_a_value_too_large_for_a_record_is_shared_by_its_digest() -> None:
    run, long = shared(), shared("model=" + "m" * 300)  # a user task's mapping is shared so too
    assert long.values["model"] == "sha256:" + digest_of("m" * 300)
    assert SharedConfig.read(long.to_record()) == long
    assert long.differences(run) == [
        f'model (run "tiny", this peer "sha256:{digest_of("m" * 300)}")'
    ]


def record(values: Any, digest: str | None = None) -> dict[str, Any]:
    """A record as a hostile peer could send it; its digest is right unless given."""
    return {"values": values, "digest": digest or digest_of(values)}


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("not a record", "a config record is an object of 'digest' and 'values'"),
        ({"values": {}}, "a config record is an object of 'digest' and 'values'"),
        ({"values": [1], "digest": "0" * 64}, "config values are a list, not an object"),
        (record({f"k{i}": i for i in range(MAX_KEYS + 1)}), f"record of {MAX_KEYS + 1} keys"),
        (record({"lr": {"nested": 1}}), "config key 'lr' holds a dict"),
        (record({"seed": 2**70}), "config key 'seed' holds a int"),
        (record({"model": "x" * 201}), "config key 'model' holds a str"),
        (record({"x" * 201: 1}), "is not a short name"),
        ({"values": {"lr": float("nan")}, "digest": "0" * 64}, "config key 'lr' holds a float"),
        (record({"lr": 0.01}, digest="z" * 64), "config digest is not 64 hex digits"),
        (record({"lr": 0.01}, digest="0" * 64), "config digest does not match its values"),
    ],
)
def test_a_malformed_or_oversized_record_is_refused_by_name(bad: Any, named: str) -> None:
    with pytest.raises(ConfigRecordError, match=named.replace("(", r"\(")):
        SharedConfig.read(bad)


class Sponsor:
    """A member's state as a join sees it: it admits whoever it is asked to (or, given an
    allowlist, whoever that names), from step 4."""

    def __init__(self, allowed: frozenset[str] | None = None) -> None:
        self.members = Members.initial(["peer-0", "peer-1"])
        self.admitted: list[str] = []
        self.allowed = allowed

    def admit(self, peer_id: str, key: str = "") -> int:
        if self.allowed is not None and key not in self.allowed:
            raise NotAllowed(f"key {key[:16]}… is not in the run's allowlist")
        self.admitted.append(peer_id)
        index = self.members.next_index()
        self.members.seats[index] = Seat(peer_id, 4, key=key)
        return index


def sponsor_exchange(state: Sponsor) -> Exchange:
    return Exchange(
        config=load_config(None, BASE),
        cond=threading.Condition(),
        link=None,  # type: ignore[arg-type]
        wiring=None,  # type: ignore[arg-type]
        state=state,  # type: ignore[arg-type]
        door=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        context=Context.of("run", ["peer-0", "peer-1"]),
        signing_key=None,  # type: ignore[arg-type]
        quorum=None,  # type: ignore[arg-type]
    )


def join_request(
    config: Any, key: Ed25519PrivateKey | None = None, proof_for: str = "peer-new"
) -> bytes:
    key = key or Ed25519PrivateKey.generate()
    proof = join_proof(key, "run", proof_for)
    return Frame(
        {"peer": "peer-new", "key": public_hex(key), "proof": proof, "config": config}
    ).encode()


def test_a_sponsor_refuses_a_joiner_with_another_config_before_admitting_it() -> None:
    state = Sponsor()
    exchange = sponsor_exchange(state)
    reply = Frame.decode(exchange.on_join("peer-new", join_request(shared("lr=0.01").to_record())))
    assert reply.header == {"config": shared().to_record()} and state.admitted == []
    with pytest.raises(TransportError, match="asked to join with a bad config: config record of"):
        exchange.on_join("peer-new", join_request(record({f"k{i}": 0 for i in range(99)})))
    with pytest.raises(TransportError, match="asked to join with a bad config: a config record"):
        exchange.on_join("peer-new", join_request(None))  # a peer of an older version
    assert state.admitted == []
    reply = Frame.decode(exchange.on_join("peer-new", join_request(shared().to_record())))
    assert (reply.header["index"], reply.header["first_step"]) == (2, 4)
    assert state.admitted == ["peer-new"] and sorted(reply.header["members"]) == ["0", "1", "2"]


def test_a_joiner_must_prove_its_key_and_be_on_the_allowlist() -> None:
    allowed_key = Ed25519PrivateKey.generate()
    state = Sponsor(allowed=frozenset({public_hex(allowed_key)}))
    exchange = sponsor_exchange(state)
    config = shared().to_record()
    # a proof made for another peer id, or none, does not seat anyone under that key
    for request in (
        join_request(config, allowed_key, proof_for="peer-other"),
        Frame({"peer": "peer-new", "key": public_hex(allowed_key), "config": config}).encode(),
    ):
        with pytest.raises(TransportError, match="without proof that it holds its key"):
            exchange.on_join("peer-new", request)
    reply = Frame.decode(exchange.on_join("peer-new", join_request(config)))
    assert reply.header == {
        "refused": f"key {reply.header['refused'][4:20]}… is not in the run's allowlist"
    }
    assert state.admitted == []
    reply = Frame.decode(exchange.on_join("peer-new", join_request(config, allowed_key)))
    assert reply.header["index"] == 2 and state.admitted == ["peer-new"]
