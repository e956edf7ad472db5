"""A peer whose config differs from the run's is refused at join, by name of the keys that differ:
in the membership (a fake DHT, so in-process and fast) it is never drawn among the initial members
and refuses itself, and as real `seedflood peer` processes it exits with code 2 before its first
step, while the run goes on without it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from seedflood.config import load_config
from seedflood.peers.admission import ConfigDiffers, SharedConfig
from seedflood.peers.launch import merge_results, peer_command

pytest.importorskip("hivemind", reason="membership needs hivemind's clock")

from seedflood.peers.membership import Membership, MembershipError, run_config
from tests.forked import Child, start_forked_peer
from tests.peers.test_node import PacedPeers, wait_until, write_config

RUN = SharedConfig.of(load_config(None, ["model=tiny", "lr=0.005"]))
OTHER = SharedConfig.of(load_config(None, ["model=tiny", "lr=0.01"]))


class FakeDHT:
    """The part of hivemind's DHT a membership uses, over one dict shared by all its peers."""

    def __init__(self, name: str, table: dict[str, Any]) -> None:
        self.peer_id = SimpleNamespace(to_base58=lambda: name)
        self.table = table

    def store(self, key: str, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is None:
            self.table[key] = value
        else:
            self.table.setdefault(key, {})[subkey] = SimpleNamespace(value=value)
        return True

    def get(self, key: str, latest: bool = True) -> Any:
        return SimpleNamespace(value=self.table[key]) if key in self.table else None


def peer(name: str, table: dict[str, Any], joined: float, config: SharedConfig) -> Membership:
    view = Membership(FakeDHT(name, table), "run", joined=joined, config=config)
    view.announce()
    return view


def test_a_peer_with_another_config_is_not_drawn_and_refuses_itself() -> None:
    table: dict[str, Any] = {}
    first = peer("QmFirst", table, 1.0, RUN)
    other = peer("QmOther", table, 2.0, OTHER)
    with pytest.raises(ConfigDiffers, match=r"lr \(run 0\.005, this peer 0\.01\)"):
        other.initial(2, timeout=0.0)
    # the first peer does not count it: still 1 of 2 with the run's config
    with pytest.raises(MembershipError, match="1 of 2 peers announced themselves"):
        first.initial(2, timeout=0.0)
    third = peer("QmThird", table, 3.0, RUN)
    assert third.initial(2, timeout=0.0) == ["QmFirst", "QmThird"]
    # a peer claiming to be the earliest decides while nobody is seated, and no more after that
    peer("QmLate", table, 0.5, OTHER)
    assert run_config(first.members()) == OTHER
    third.announce(index=0)
    first.announce(index=1)
    assert run_config(first.members()) == RUN


def test_a_record_with_a_bad_config_is_left_out_and_an_older_one_has_no_say() -> None:
    table: dict[str, Any] = {}
    honest = peer("QmHonest", table, 2.0, RUN)
    hostile = {"digest": "0" * 64, "values": {f"k{i}": i for i in range(1000)}}
    honest.dht.store(honest.key, [1.0, -1, False, "", hostile], 0.0, subkey="QmHostile")
    honest.dht.store(honest.key, [0.5, -1, False, ""], 0.0, subkey="QmOlder")
    members = honest.members()
    assert [m.peer_id for m in members] == ["QmOlder", "QmHonest"]
    assert members[0].config is None and members[1].config == RUN
    assert run_config(members) == RUN


def start_other(peers: PacedPeers, k: int, overrides: list[str]) -> Child:
    """A peer of the run started with ``overrides`` on top of the run's config file."""
    command = peer_command(
        peers.config_file,
        run_id=peers.run_id,
        directory=peers.dir(k),
        overrides=overrides,
        initial_peers=[peers.address] if peers.address else [],
        evaluate=False,
    )
    peers.processes[k] = start_forked_peer(command, peers.dir(k))
    return peers.processes[k]


def refusal(peers: PacedPeers, k: int) -> str:
    """What peer k said, once it ended as a refused peer does: code 2, no traceback, no seat."""
    code = peers.processes.pop(k).wait(timeout=180)
    text = " ".join((peers.dir(k) / "peer.log").read_text().split())
    assert code == 2 and "Traceback" not in text, text
    assert not (peers.dir(k) / "state" / "peer.json").exists()  # it never took a seat
    return text


@pytest.mark.slow  # real `seedflood peer` processes
@pytest.mark.xdist_group("real_peers")
def test_real_peers_refuse_a_peer_with_another_config_and_finish_without_it(
    data_dir, tmp_path: Path
) -> None:
    rounds = 30  # of 1 s: the late peer must be refused (10 s and more when loaded) mid-run
    config_file = write_config(tmp_path / "run.yaml", data_dir, clients=2, rounds=rounds, lr=0.005)
    with PacedPeers(config_file, "strict", tmp_path / "out", pace=1.0) as peers:
        peers.start(0)
        start_other(peers, 2, ["lr=0.01"])  # before the run has its initial members
        said = refusal(peers, 2)
        assert "error: peer config differs from the run's: lr (run 0.005, this peer 0.01)" in said
        peers.start(1)
        wait_until(lambda: peers.round(0) >= 1, 180, "round 1")
        start_other(peers, 3, ["lr=0.01", "batch_size=8"])  # a joiner, mid-run
        said = refusal(peers, 3)
        assert (
            "error: peer config differs from the run's: batch_size (run 4, this peer 8), "
            "lr (run 0.005, this peer 0.01)"
        ) in said
        assert peers.round(0) < rounds
        peers.finish()
    results = merge_results(tmp_path / "out", [peers.dir(0), peers.dir(1)])
    assert (
        results["consensus"] and [p["committed_step"] for p in results["peers"]] == [rounds - 1] * 2
    )
    assert all(p["divergences"] == 0 for p in results["peers"])
    seats = json.loads((peers.dir(0) / "state" / "members.json").read_text())
    assert sorted(seats) == ["0", "1"]
