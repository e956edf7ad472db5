"""`seedflood peer`: one SeedFlood client in its own process, talking to the others over hivemind.

The process finds the run in hivemind's DHT, takes its client index (one of the run's first
``clients`` peers, a peer restarting from its state dir, or a joiner admitted by a sponsor),
catches up by fetching what it lacks from a live member, and trains: every round it waits until
the staleness rule lets it step, makes its messages and pushes them to its neighbours, who push
them on. All decisions about the model are `PeerState`'s; this module adds the network, the
clocks and the files.

Nothing waits forever. Waiting for a step, the peer pulls what its neighbours hold after a few
typical round times (a lost push, or a neighbour that restarted), and once members have been
missing for longer, the lowest-indexed member present proposes their removal and a majority of
the others sign it (`seedflood.peers.waiting`, `seedflood.peers.quorum`). Neighbours are the
run's topology laid over the live members in index order, recomputed as members come and go, so
the graph stays connected.
"""

from __future__ import annotations

import fcntl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from seedflood.build import (
    Parts,
    build_parts,
    compute_device,
    on_device,
    run_direction,
    run_precision,
)
from seedflood.config import RunConfig
from seedflood.files import atomic_write_json, atomic_write_jsonl, atomic_write_text, read_jsonl
from seedflood.learning.accuracy_cache import cached_accuracy
from seedflood.learning.models import state_hash
from seedflood.learning.schedules import eps_schedule, lr_schedule
from seedflood.peers.batch_exchange import Exchange, open_link
from seedflood.peers.crypto import Context, load_or_create_key, public_hex
from seedflood.peers.inbox import BatchStore, Door
from seedflood.peers.membership import MembershipError, check_run_id
from seedflood.peers.options import (
    EQUIVOCATE_VARIABLE,
    HOSTILE_VARIABLE,
    SILENT_VARIABLE,
    PeerError,
    PeerOptions,
    Say,
    fault_round,
)
from seedflood.peers.p2p import (
    FLOOD_PROTOCOL,
    JOIN_PROTOCOL,
    SYNC_PROTOCOL,
    EventLoopThread,
    Handler,
)
from seedflood.peers.peer_results import PeerRecords
from seedflood.peers.quorum import DECIDE_PROTOCOL, Quorum
from seedflood.peers.roster import Members
from seedflood.peers.seats import Seating, start_dht
from seedflood.peers.state import PeerState
from seedflood.peers.waiting import RoundClock, Waiting, removed_error
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.guard import DivergenceGuard
from seedflood.zo import SubCGEDirection

__all__ = ["Node", "PeerError", "PeerOptions", "peer_state", "run_peer"]


def peer_state(
    config: RunConfig,
    parts: Parts,
    direction: SubCGEDirection,
    *,
    me: int,
    members: Members,
    state_dir: Path,
    on_divergence: Callable[[str], None] | None = None,
    allowed: frozenset[str] | None = None,
) -> PeerState:
    """Client ``me`` of a run of ``config``, training ``parts``' model along ``direction``: what
    a peer process builds once seated, kept apart so tests can hold such states beside the
    simulator built from the same config."""
    return PeerState(
        me=me,
        members=members,
        model=parts.model,
        direction=direction,
        shard=parts.shard(me % config.clients),
        pad_id=parts.pad_id,
        state_dir=state_dir,
        clients=config.clients,
        lr=lr_schedule(config),
        eps=eps_schedule(config),
        batch_size=config.batch_size,
        local_steps=config.steps_per_round,
        staleness=config.staleness,
        scalar_format=config.scalar_format,
        run_seed=config.seed,
        hash_every=config.hash_every,
        snapshot_every=config.snapshot_every,
        on_divergence=on_divergence,
        clip=ScalarClip.from_config(config),
        guard=DivergenceGuard.from_config(config),
        allowed=allowed,
    )


class Node(PeerRecords, Waiting):
    """One peer process: the state, the link, its seating and exchange, and the loops that
    drive them. One lock (``cond``) guards the state and what seating and exchange keep."""

    def __init__(self, config: RunConfig, options: PeerOptions, say: Say) -> None:
        self.config, self.options, self.say = config, options, say
        self.device = compute_device(options.device, setting="--device", on_cpu="use --device cpu")
        self.local_steps = config.steps_per_round
        self.cond = threading.Condition()
        self.clock = RoundClock(floor=0.2)
        self.history: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.longest_stall = 0.0
        self.made_messages = False  # in this process: a restart starts with none
        self.last_removal = time.monotonic()

    # -- start-up -----------------------------------------------------------------------------

    def start(self) -> None:
        """Bring the parts up in the order each becomes possible: the link before the seat (a
        joiner asks for its seat over it), the state after it, and the exchange last."""
        options = self.options
        options.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = (options.state_dir / "lock").open("w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PeerError(f"another peer is running on state dir {options.state_dir}") from None
        signing_key = load_or_create_key(options.state_dir)
        atomic_write_text(options.state_dir / "public.key", public_hex(signing_key) + "\n")
        if options.allowed is not None and public_hex(signing_key) not in options.allowed:
            raise PeerError(
                f"this peer's key {public_hex(signing_key)} (in {options.state_dir}/public.key) "
                "is not in the allowlist given with --allow"
            )
        torch.manual_seed(self.config.seed)
        self.parts = build_parts(self.config, self.device)
        self.dht = start_dht(options, self.say, signing_key)
        addresses = [str(a) for a in self.dht.get_visible_maddrs()]
        atomic_write_text(options.state_dir / "address", "\n".join(addresses) + "\n")
        self.say(f"peer {self.dht.peer_id.to_base58()} listening on {' '.join(addresses)}")
        self.runner = EventLoopThread()
        p2p = self.runner.run(self.dht.replicate_p2p())
        self.link = open_link(p2p, self.runner, self._handlers(), self.say)
        self.seating = Seating(
            self.config,
            options,
            self.say,
            self.cond,
            self.stopping,
            dht=self.dht,
            link=self.link,
            signing_key=signing_key,
        )
        me, members, joined = self.seating.take_seat()
        self.state = self._new_state(me, members)
        atomic_write_json(
            options.state_dir / "peer.json",
            {"run_id": options.run_id, "index": me, "joined": joined},
        )
        seats = self.state.members.seats
        initial = [seats[i].peer_id for i in range(self.config.clients)]
        context = Context.of(options.run_id, initial)
        self.door = Door(context, self.local_steps, say=self.say)
        self.quorum = Quorum(
            cond=self.cond,
            state=self.state,
            door=self.door,
            context=context,
            signing_key=signing_key,
            say=self.say,
            live_ids=lambda: self.seating.live_ids,
        )
        self.exchange = Exchange(
            config=self.config,
            cond=self.cond,
            link=self.link,
            wiring=self.seating,
            state=self.state,
            door=self.door,
            store=BatchStore(options.state_dir / "batches.jsonl"),
            context=context,
            signing_key=signing_key,
            quorum=self.quorum,
        )
        self.link.gate = self.exchange  # it decides whom the link hears, and how much
        self.exchange.restore()
        self.seating.seated(self.state, self.door)
        if self.state.members.seats[me].gone_from is not None:
            raise removed_error(me, self.state.members.seats[me].gone_from, self.options)
        self.link.start()
        if self.state.replayed:
            self.say(f"client {me}: replayed {self.state.replayed} logged messages")

    def _new_state(self, me: int, members: Members) -> PeerState:
        direction = run_direction(self.config, self.parts.model)
        self.base_hash = state_hash(direction.tensors)  # before the log is replayed into it
        return peer_state(
            self.config,
            self.parts,
            direction,
            me=me,
            members=members,
            state_dir=self.options.state_dir,
            on_divergence=lambda text: self.say(f"DIVERGENCE: {text}"),
            allowed=self.options.allowed,
        )

    def _handlers(self) -> dict[str, Handler]:
        """What the link serves. It exists before the exchange (a joiner needs it to ask for a
        seat), so these find the exchange when called: the link serves nothing before its
        ``start``, which follows the exchange."""
        return {
            FLOOD_PROTOCOL: lambda caller, data: self.exchange.on_flood(caller, data),
            SYNC_PROTOCOL: lambda caller, data: self.exchange.on_sync(caller, data),
            JOIN_PROTOCOL: lambda caller, data: self.exchange.on_join(caller, data),
            DECIDE_PROTOCOL: lambda caller, data: self.quorum.on_decide(caller, data),
        }

    # -- the loop -----------------------------------------------------------------------------

    def run(self, progress: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        state, config = self.state, self.config
        report = progress or (lambda _round, _record: None)
        if (self.options.out_dir / "history.jsonl").is_file():
            self.history = read_jsonl(self.options.out_dir / "history.jsonl")
        last_step = config.rounds * self.local_steps - 1
        self.seating.look_around()
        self.exchange.pull(self.seating.others())
        self._wait(lambda: True, "the catch-up")
        if self.options.evaluate:
            self.zero_shot = cached_accuracy(
                self.state.model,
                self.parts.test,
                self.parts.pad_id,
                self.config.eval_batch_size,
            )
            self.say(f"zero-shot test accuracy {self.zero_shot:.4f}")
        train_seconds = 0.0
        silent = fault_round(SILENT_VARIABLE, "silent from", self.say)
        equivocate = fault_round(EQUIVOCATE_VARIABLE, "equivocating in", self.say)
        hostile = fault_round(HOSTILE_VARIABLE, "attacking in", self.say)
        next_round = self._next_round()
        round_started = time.monotonic()
        while next_round < config.rounds and state.tripped is None:
            if self._owes_nothing():
                self._leave()
            self._wait(lambda r=next_round: state.ready_for(r), f"round {next_round}")
            if state.tripped is not None:
                break
            if next_round == silent:
                self.stopping.wait()  # alive, its DHT record renewed, sending nothing
                break
            messages, losses = state.originate(next_round, guard=self.cond)
            self.made_messages = True
            with self.cond:
                self.cond.notify_all()  # a joiner's sponsor waits for its admission to be sent
                targets = dict(self.seating.neighbors)
                batch = self.exchange.sign_own(next_round, messages)
            if next_round == equivocate:
                self.exchange.equivocate(targets, batch)
            else:
                self.exchange.push(targets, [batch], [])
            if next_round == hostile:
                self.exchange.attack(targets, next_round)
            done = next_round + 1
            record = {"round": done, "train_loss": sum(losses) / len(losses)}
            if self.options.evaluate and (done % config.eval_every == 0 or done == config.rounds):
                self._wait(lambda d=done: state.committed_step >= d * self.local_steps - 1, "eval")
                train_seconds += time.monotonic() - round_started
                record["accuracy"] = self.accuracy(self.parts.val)
                round_started = time.monotonic()
                self.history.append({**record, "train_seconds": train_seconds})
                atomic_write_jsonl(self.options.out_dir / "history.jsonl", self.history)
            record["committed_step"] = state.committed_step
            record["wall_seconds"] = time.perf_counter() - started
            atomic_write_json(self.options.out_dir / "status.json", record, durable=False)
            report(done, record)
            next_round = done
            if self.options.pace:
                time.sleep(max(0.0, self.options.pace - (time.monotonic() - round_started)))
            self.clock.add(time.monotonic() - round_started)
            train_seconds += time.monotonic() - round_started
            round_started = time.monotonic()
        self._wait(lambda: state.committed_step >= last_step, "the last step")
        if state.tripped is not None:
            self.say(state.tripped.explain(state.lr(state.tripped.step)))
        results = {**self.peer_results(started, train_seconds), **self.hand_out()}
        self.seating.finish()
        self._linger()
        results.update(self.traffic())
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
        # Every tensor the peer makes lands on its device, and every forward (all on this
        # thread: the link's threads only move messages) runs in the config's precision.
        with on_device(node.device), run_precision(config, node.device):
            node.start()
            return node.run(progress)
    except MembershipError as error:
        raise PeerError(str(error)) from None
    finally:
        node.stop()
