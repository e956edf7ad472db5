"""`seedflood peer`: one SeedFlood client in its own process, talking to the others over hivemind.

The process finds the run in hivemind's DHT, takes its client index (one of the run's first
``clients`` peers, a peer restarting from its state dir, or a joiner admitted by a sponsor),
catches up by fetching what it lacks from a live member, and trains: every round it waits until
the staleness rule lets it step, makes its messages and pushes them to its neighbours, who push
them on. All decisions about the model are `PeerState`'s; this module adds the network, the
clocks and the files.

Nothing waits forever. Waiting for a step, the peer pulls what its neighbours hold after a few
typical round times (a lost push, or a neighbour that restarted), and once a missing member has
also vanished from the DHT for a while, the sponsor (the live member with the lowest index)
declares it gone and floods the declaration. Neighbours are the run's topology laid over the
live members in index order, recomputed as members come and go, so the graph stays connected.
"""

from __future__ import annotations

import fcntl
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seedflood import __version__
from seedflood.config import RunConfig
from seedflood.membership import Membership, MembershipError, check_run_id
from seedflood.messages import SCALAR_BYTES, decode_packet, encode_packet
from seedflood.metrics import (
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    read_jsonl,
)
from seedflood.network import EdgeTraffic, edge_summary
from seedflood.p2p import (
    FLOOD_PROTOCOL,
    JOIN_PROTOCOL,
    SYNC_PROTOCOL,
    EventLoopThread,
    Frame,
    Link,
    TransportError,
)
from seedflood.peer import Control, Key, Members, PeerState
from seedflood.scoring import accuracy
from seedflood.topology import TopologyError, make_topology

Say = Callable[[str], None]


class PeerError(RuntimeError):
    """What stops a peer, phrased for its operator."""


@dataclass
class PeerOptions:
    """How one peer process runs; the training itself is the run's config."""

    run_id: str
    state_dir: Path
    out_dir: Path
    initial_peers: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    ttl: float = 6.0
    pace: float = 0.0
    evaluate: bool = True
    start_timeout: float = 120.0
    linger: float = 60.0


def carried_to_json(carried: dict[Key, list[Control]]) -> list[Any]:
    return [[step, origin, controls] for (step, origin), controls in sorted(carried.items())]


def carried_from_json(data: Any) -> dict[Key, list[Control]]:
    try:
        return {(int(step), int(origin)): list(controls) for step, origin, controls in data or []}
    except (TypeError, ValueError) as exc:
        raise TransportError(f"bad 'carried' field: {exc}") from None


class RoundClock:
    """Typical round time, for timeouts that follow the run's real pace."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self.durations: list[float] = []

    def add(self, seconds: float) -> None:
        self.durations = [*self.durations[-19:], seconds]

    def typical(self) -> float:
        return max(self.floor, statistics.median(self.durations) if self.durations else 0.0)


class Node:
    """One peer process: the state, the link, the membership, and the loops that drive them."""

    def __init__(self, config: RunConfig, options: PeerOptions, say: Say) -> None:
        self.config, self.options, self.say = config, options, say
        self.local_steps = config.steps_per_round
        self.cond = threading.Condition()
        self.edges: dict[tuple[int, int], EdgeTraffic] = {}
        self.neighbors: dict[int, str] = {}
        self.live_ids: set[str] = set()
        self.clock = RoundClock(floor=0.2)
        self.history: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.done = False

    # -- start-up -----------------------------------------------------------------------------

    def start(self) -> None:
        import hivemind

        from seedflood.simulator import build

        options = self.options
        options.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = (options.state_dir / "lock").open("w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PeerError(f"another peer is running on state dir {options.state_dir}") from None
        torch.manual_seed(self.config.seed)
        self.experiment = build(self.config)
        self.dht = self._start_dht(hivemind)
        addresses = [str(a) for a in self.dht.get_visible_maddrs()]
        atomic_write_text(options.state_dir / "address", "\n".join(addresses) + "\n")
        self.say(f"peer {self.dht.peer_id.to_base58()} listening on {' '.join(addresses)}")
        self.runner = EventLoopThread()
        p2p = self.runner.run(self.dht.replicate_p2p())
        handlers = {FLOOD_PROTOCOL: self._on_flood, SYNC_PROTOCOL: self._on_sync}
        handlers[JOIN_PROTOCOL] = self._on_join
        self.link = Link(p2p, self.runner, handlers, timeout=10.0)
        self.index = -1
        self._renewer = threading.Thread(target=self._renew, daemon=True)
        me, members, joined = self._seat()
        self.index = me
        algorithm = self.experiment.algorithm
        self.state = PeerState(
            me=me,
            members=members,
            model=algorithm.model,
            direction=algorithm.direction,
            shard=algorithm.shards[me % algorithm.n],
            pad_id=algorithm.pad_id,
            state_dir=options.state_dir,
            clients=self.config.clients,
            lr=self.config.lr,
            eps=self.config.eps,
            batch_size=self.config.batch_size,
            local_steps=self.local_steps,
            staleness=self.config.staleness,
            scalar_format=self.config.scalar_format,
            run_seed=self.config.seed,
            hash_every=self.config.hash_every,
            snapshot_every=self.config.snapshot_every,
            on_divergence=lambda text: self.say(f"DIVERGENCE: {text}"),
        )
        atomic_write_json(
            options.state_dir / "peer.json",
            {"run_id": options.run_id, "index": me, "joined": joined},
        )
        if self.state.members.seats[me].gone_from is not None:
            raise PeerError(
                f"client {me} was declared gone from step {self.state.members.seats[me].gone_from}"
                "; start it with a new state dir to join the run again"
            )
        self.link.start()
        if self.state.replayed:
            self.say(f"client {me}: replayed {self.state.replayed} logged messages")

    def _start_dht(self, hivemind: Any, attempts: int = 4) -> Any:
        """hivemind's daemon gives up when a bootstrap peer does not answer at once, as happens
        on a loaded machine or a slow link: try again a few times before giving up."""
        from hivemind.p2p import P2PDaemonError

        options = self.options
        attempt = 1
        while True:
            try:
                return hivemind.DHT(
                    initial_peers=options.initial_peers or None,
                    host_maddrs=[f"/ip4/{options.host}/tcp/{options.port}"],
                    identity_path=str(options.state_dir / "identity.key"),
                    check_if_identity_free=False,
                    start=True,
                )
            except P2PDaemonError as error:
                if attempt == attempts:
                    raise PeerError(
                        f"could not join through {' '.join(options.initial_peers)} after "
                        f"{attempts} attempts: {error}"
                    ) from None
                self.say(f"could not reach the bootstrap peers ({error}); retrying")
                time.sleep(2.0 * attempt)
                attempt += 1

    def _seat(self) -> tuple[int, Members, float]:
        """This peer's client index, the members it knows of, and its join time."""
        saved = self.options.state_dir / "peer.json"
        if saved.is_file():
            record = json.loads(saved.read_text())
            if record["run_id"] != self.options.run_id:
                raise PeerError(
                    f"state dir {self.options.state_dir} belongs to run {record['run_id']!r}, "
                    f"not {self.options.run_id!r}"
                )
            self.membership = Membership(
                self.dht, self.options.run_id, self.options.ttl, joined=record["joined"]
            )
            self.index = record["index"]
            self._renewer.start()
            return record["index"], Members({}), record["joined"]
        self.membership = Membership(self.dht, self.options.run_id, self.options.ttl)
        self._renewer.start()
        joined = self.membership.me.joined
        initial = self.membership.initial(self.config.clients, self.options.start_timeout)
        if self.membership.me.peer_id in initial:
            me = initial.index(self.membership.me.peer_id)
            self.index = me
            self.membership.announce(me)
            return me, Members.initial(initial), joined
        return *self._join(), joined

    def _join(self) -> tuple[int, Members]:
        """Ask a live member to sponsor this peer; its admission rides on the sponsor's next
        message, so every member learns it before the steps it concerns."""
        deadline = time.monotonic() + self.options.start_timeout
        request = Frame({"peer": self.membership.me.peer_id}).encode()
        while time.monotonic() < deadline:
            for member in sorted(self.membership.members(), key=lambda m: m.index):
                if member.index < 0 or member.peer_id == self.membership.me.peer_id:
                    continue
                reply = self.link.request(member.peer_id, JOIN_PROTOCOL, request)
                if reply is None:
                    continue
                header = Frame.decode(reply).header
                self.say(
                    f"admitted as client {header['index']} from step {header['first_step']} by "
                    f"client {member.index}"
                )
                self.index = header["index"]
                self.membership.announce(self.index)
                return header["index"], Members.from_json(header["members"])
            time.sleep(0.5)
        raise PeerError(f"no member of run {self.options.run_id!r} admitted this peer in time")

    def _renew(self) -> None:
        """Keep this peer's record alive and follow who else is."""
        while not self.stopping.is_set():
            try:
                self.membership.announce(self.index, self.done)
                live = {m.peer_id for m in self.membership.members()}
            except Exception as exc:  # the DHT process is going down with us
                self.say(f"membership renewal failed: {exc}")
                live = None
            if live is not None and hasattr(self, "state"):
                with self.cond:
                    self.live_ids = live
                    self._rewire()
            self.stopping.wait(self.options.ttl / 3)

    def _rewire(self) -> None:
        """Neighbours: the run's topology over the live members, in index order."""
        seats = self.state.members.seats
        live = sorted(
            i
            for i, seat in seats.items()
            if seat.gone_from is None and (seat.peer_id in self.live_ids or i == self.state.me)
        )
        if len(live) < 2:
            self.neighbors = {}
            return
        try:
            topology = make_topology(self.config.topology, len(live), seed=self.config.seed)
        except TopologyError:
            topology = make_topology("ring", len(live))
        position = live.index(self.state.me)
        self.neighbors = {live[p]: seats[live[p]].peer_id for p in topology.neighbors[position]}

    # -- serving ------------------------------------------------------------------------------

    def _on_flood(self, caller: str, data: bytes) -> None:
        self._take(caller, Frame.decode(data))
        return None

    def _take(self, caller: str, frame: Frame) -> int:
        """Hold what a flood or sync frame brings that is new and push it on to every neighbour
        but the one it came from; how many messages were new."""
        messages, _ = decode_packet(frame.body) if frame.body else ([], "")
        carried = carried_from_json(frame.header.get("carried"))
        with self.cond:
            seats = len(self.state.members.seats)
            fresh = self.state.receive(messages, carried)
            gone = [
                (int(index), int(step))
                for index, step in frame.header.get("gone", [])
                if self.state.depart(int(index), int(step))
            ]
            if gone or len(self.state.members.seats) != seats:
                self._rewire()
            if fresh or gone:
                self.cond.notify_all()
            targets = {i: p for i, p in self.neighbors.items() if p != caller}
            fresh_carried = {m.key: self.state.carried[m.key] for m in fresh if m.key in carried}
        if fresh or gone:
            self._push(targets, fresh, fresh_carried, gone)
        return len(fresh)

    def _on_sync(self, caller: str, data: bytes) -> bytes:
        since = int(Frame.decode(data).header["since"])
        with self.cond:
            messages, carried = self.state.held_since(since)
            header = {"members": self.state.members.to_json(), "carried": carried_to_json(carried)}
        body = encode_packet(messages, self.config.scalar_format) if messages else b""
        return Frame(header, body).encode()

    def _on_join(self, caller: str, data: bytes) -> bytes:
        peer_id = str(Frame.decode(data).header["peer"])
        with self.cond:
            index = self.state.admit(peer_id)
            self.say(f"sponsoring {peer_id} as client {index}")
            self.cond.wait_for(lambda: index in self.state.members.seats, timeout=60)
            seat = self.state.members.seats[index]
            members = self.state.members.to_json()
        return Frame({"index": index, "first_step": seat.first_step, "members": members}).encode()

    # -- sending ------------------------------------------------------------------------------

    def _push(
        self,
        targets: dict[int, str],
        messages: list,
        carried: dict[Key, list[Control]],
        gone: list[tuple[int, int]],
    ) -> None:
        header: dict[str, Any] = {"carried": carried_to_json(carried)}
        if gone:
            header["gone"] = [list(g) for g in gone]
        body = encode_packet(messages, self.config.scalar_format) if messages else b""
        data = Frame(header, body).encode()
        reached = self.link.push({peer: data for peer in targets.values()})
        scalar_bytes = SCALAR_BYTES[self.config.scalar_format]
        with self.cond:
            for index, peer in targets.items():
                if peer in reached and messages:
                    edge = self.edges.setdefault((self.state.me, index), EdgeTraffic())
                    edge.bytes += len(body)
                    edge.messages += len(messages)
                    edge.packets += 1
                    edge.header_bytes += len(body) - len(messages) * scalar_bytes

    def _pull(self, peers: list[str]) -> int:
        """Fetch what ``peers`` hold beyond this peer's committed prefix; new messages found."""
        found = 0
        for peer in peers:
            with self.cond:
                since = self.state.committed_step + 1
            reply = self.link.request(peer, SYNC_PROTOCOL, Frame({"since": since}).encode())
            if reply is None:
                continue
            frame = Frame.decode(reply)
            with self.cond:
                if self.state.learn(Members.from_json(frame.header["members"])):
                    self._rewire()
            found += self._take(peer, frame)
        return found

    # -- the loop -----------------------------------------------------------------------------

    def _others(self) -> list[str]:
        """Whom to ask for what is missing: the neighbours, else any live member."""
        with self.cond:
            if self.neighbors:
                return list(self.neighbors.values())
            return [
                seat.peer_id
                for i, seat in self.state.members.seats.items()
                if i != self.state.me and seat.gone_from is None and seat.peer_id in self.live_ids
            ]

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Commit what arrives until ``ready``; pull after a few round times without progress,
        and have a vanished member declared gone after longer."""
        since = last_pull = last_note = time.monotonic()
        while True:
            with self.cond:
                if self.state.commit():
                    since = last_pull = time.monotonic()
                if ready():
                    return
                self.cond.wait(0.05)
            now, typical = time.monotonic(), self.clock.typical()
            if now - last_pull > 3 * typical:
                self._pull(self._others())
                last_pull = time.monotonic()
            if now - since > max(10 * typical, 3 * self.options.ttl):
                self._declare_vanished()
            if now - last_note > 30:
                with self.cond:
                    missing = self.state.missing()
                self.say(
                    f"waiting for {what}: step {self.state.committed_step + 1} lacks {missing}"
                )
                last_note = now

    def _declare_vanished(self) -> None:
        """The sponsor declares missing members that left the DHT gone, after pulling once more
        so that the declaration does not cut off a message someone still holds."""
        with self.cond:
            seats, live = self.state.members.seats, self.live_ids
            vanished = [i for i in self.state.missing() if seats[i].peer_id not in live]
            present = [
                i
                for i, seat in seats.items()
                if seat.gone_from is None and (seat.peer_id in live or i == self.state.me)
            ]
        if not vanished or min(present) != self.state.me:
            return
        self._pull(self._others())
        with self.cond:
            gone = []
            for index in vanished:
                step = self.state.last_step_of(index) + 1
                if self.state.depart(index, step):
                    gone.append((index, step))
                    self.say(f"declared client {index} gone from step {step}")
            self._rewire()
            targets = dict(self.neighbors)
        if gone:
            self._push(targets, [], {}, gone)

    def run(self, progress: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        state, config = self.state, self.config
        report = progress or (lambda _round, _record: None)
        if (self.options.out_dir / "history.jsonl").is_file():
            self.history = read_jsonl(self.options.out_dir / "history.jsonl")
        last_step = config.rounds * self.local_steps - 1
        with self.cond:
            self.live_ids = {m.peer_id for m in self.membership.members()}
            self._rewire()
        self._pull(self._others())
        self._wait(lambda: True, "the catch-up")
        if self.options.evaluate:
            self.zero_shot = self._accuracy(self.experiment.test)
            self.say(f"zero-shot test accuracy {self.zero_shot:.4f}")
        train_seconds = 0.0
        next_round = max(
            state.own_rounds_done(), state.round_of(state.members.seats[state.me].first_step)
        )
        round_started = time.monotonic()
        while next_round < config.rounds:
            self._wait(lambda r=next_round: state.ready_for(r), f"round {next_round}")
            messages, losses = state.originate(next_round, guard=self.cond)
            with self.cond:
                self.cond.notify_all()  # a joiner's sponsor waits for its admission to be sent
                targets = dict(self.neighbors)
                carried = {m.key: state.carried[m.key] for m in messages if m.key in state.carried}
            self._push(targets, messages, carried, [])
            done = next_round + 1
            record = {"round": done, "train_loss": sum(losses) / len(losses)}
            if self.options.evaluate and (done % config.eval_every == 0 or done == config.rounds):
                self._wait(lambda d=done: state.committed_step >= d * self.local_steps - 1, "eval")
                train_seconds += time.monotonic() - round_started
                record["accuracy"] = self._accuracy(self.experiment.val)
                round_started = time.monotonic()
                self.history.append({**record, "train_seconds": train_seconds})
                atomic_write_jsonl(self.options.out_dir / "history.jsonl", self.history)
            record["committed_step"] = state.committed_step
            record["wall_seconds"] = time.perf_counter() - started
            atomic_write_json(self.options.out_dir / "status.json", record)
            report(done, record)
            next_round = done
            if self.options.pace:
                time.sleep(max(0.0, self.options.pace - (time.monotonic() - round_started)))
            self.clock.add(time.monotonic() - round_started)
            train_seconds += time.monotonic() - round_started
            round_started = time.monotonic()
        self._wait(lambda: state.committed_step >= last_step, "the last step")
        results = self._results(started, train_seconds)
        self.done = True
        self.membership.announce(self.index, True)
        self._linger()
        results.update(self._traffic())
        atomic_write_json(self.options.out_dir / "results.json", results)
        return results

    def _linger(self) -> None:
        """Keep serving until every live member has finished too: a neighbour that restarted or
        joined late may still need this peer's messages."""
        deadline = time.monotonic() + self.options.linger
        while time.monotonic() < deadline:
            with self.cond:
                self.state.commit()
            members = self.membership.members()
            if all(m.done for m in members if m.index >= 0):
                return
            time.sleep(0.2)
        self.say(f"stopped waiting for the other peers to finish after {self.options.linger:g} s")

    def _traffic(self) -> dict[str, Any]:
        with self.cond:
            edges = {key: EdgeTraffic(**vars(edge)) for key, edge in self.edges.items()}
        counters = self.link.counters
        return {
            **edge_summary(edges),
            "edges": [
                [s, r, e.bytes, e.messages, e.packets, e.header_bytes]
                for (s, r), e in sorted(edges.items())
            ],
            "repair_bytes_sent": counters.sent.get(SYNC_PROTOCOL, 0),
            "repair_bytes_received": counters.received.get(SYNC_PROTOCOL, 0),
            "wire_bytes_sent": sum(counters.sent.values()),
        }

    def _accuracy(self, examples: list) -> float:
        config = self.config
        return accuracy(self.state.model, examples, self.experiment.pad_id, config.eval_batch_size)

    def _results(self, started: float, train_seconds: float) -> dict[str, Any]:
        state, config, experiment = self.state, self.config, self.experiment
        results: dict[str, Any] = {
            "kind": "peer",
            "method": config.name,
            "version": __version__,
            "run_id": self.options.run_id,
            "client": state.me,
            "peer_id": self.membership.me.peer_id,
            "state_hash": state.state_hash(),
            "committed_step": state.committed_step,
            "rounds": config.rounds,
            "steps": config.rounds * self.local_steps,
            "clients": config.clients,
            "topology": config.topology,
            "members": state.members.to_json(),
            "divergences": state.divergences,
            "replayed": state.replayed,
            "messages_committed": len(state.committed),
            "wall_seconds": time.perf_counter() - started,
            "train_seconds": train_seconds,
            "data_source": experiment.data_source,
            "config": config.model_dump(),
        }
        if self.options.evaluate:
            results["zero_shot_accuracy"] = self.zero_shot
            results["accuracy"] = self._accuracy(experiment.test)
        results.update(self._traffic())
        atomic_write_json(self.options.out_dir / "results.json", results)
        return results

    def stop(self) -> None:
        self.stopping.set()
        if hasattr(self, "link"):
            self.link.close()
        if hasattr(self, "dht"):
            self.dht.shutdown()
        if hasattr(self, "runner"):
            self.runner.stop()


def run_peer(
    config: RunConfig,
    options: PeerOptions,
    say: Say = print,
    progress: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run one peer to the end of the run; its results.json lands in ``options.out_dir``."""
    if config.method != "seedflood":
        raise PeerError(f"real peers run method seedflood; the config asks for {config.method!r}")
    try:
        check_run_id(options.run_id)
    except ValueError as error:
        raise PeerError(str(error)) from None
    options.out_dir.mkdir(parents=True, exist_ok=True)
    node = Node(config, options, say)
    try:
        node.start()
        return node.run(progress)
    except MembershipError as error:
        raise PeerError(str(error)) from None
    finally:
        node.stop()
