"""How a peer process takes its seat in a run and keeps its view of the others current.

A peer starts its DHT node, then takes its client index: one of the run's first ``clients``
peers, a peer restarting from its state dir, or a joiner admitted by a sponsor. Afterwards it
renews its membership record and recomputes its neighbours as members come, go or are banned.
The node owns one `Seating`; its exchange rewires through it when the member table changes.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from seedflood.peers.admission import ConfigRecordError, SharedConfig
from seedflood.peers.crypto import join_proof, public_hex
from seedflood.peers.membership import Member, Membership, run_config
from seedflood.peers.options import PeerError, PeerOptions, Say
from seedflood.peers.p2p import JOIN_PROTOCOL, Frame
from seedflood.peers.roster import Members, Seat
from seedflood.topology import TopologyError, make_topology

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from seedflood.config import RunConfig
    from seedflood.peers.inbox import Door
    from seedflood.peers.p2p import Link
    from seedflood.peers.state import PeerState

__all__ = ["Seating", "start_dht"]


def start_dht(
    options: PeerOptions, say: Say, signing_key: Ed25519PrivateKey, attempts: int = 4
) -> Any:
    """hivemind's daemon gives up when a bootstrap peer does not answer at once, as happens
    on a loaded machine or a slow link: try again a few times before giving up. The DHT node
    signs this peer's run records and refuses invalid ones (`seedflood.peers.records`)."""
    import hivemind
    from hivemind.p2p import P2PDaemonError

    from seedflood.peers.records import OwnedRecords

    validator = OwnedRecords(options.run_id, signing_key, options.allowed)

    attempt = 1
    while True:
        try:
            return hivemind.DHT(
                initial_peers=options.initial_peers or None,
                host_maddrs=[f"/ip4/{options.host}/tcp/{options.port}"],
                identity_path=str(options.state_dir / "identity.key"),
                check_if_identity_free=False,
                record_validators=[validator],
                start=True,
            )
        except P2PDaemonError as error:
            if attempt == attempts:
                raise PeerError(
                    f"could not join through {' '.join(options.initial_peers)} after "
                    f"{attempts} attempts: {error}"
                ) from None
            say(f"could not reach the bootstrap peers ({error}); retrying")
            time.sleep(2.0 * attempt)
            attempt += 1


class Seating:
    """This peer's seat, its membership record, and who its neighbours are.

    The seat comes before the member table (`PeerState` is built for a known seat), yet the
    record must be renewed from the start: until `seated` hands over the table, renewal only
    keeps the record alive, and afterwards it also follows keys and rewires.
    """

    def __init__(
        self,
        config: RunConfig,
        options: PeerOptions,
        say: Say,
        cond: threading.Condition,
        stopping: threading.Event,
        *,
        dht: Any,
        link: Link,
        signing_key: Ed25519PrivateKey,
    ) -> None:
        self.config, self.options, self.say = config, options, say
        self.cond, self.stopping = cond, stopping
        self.link, self.signing_key = link, signing_key
        self.key = public_hex(signing_key)
        self.shared = SharedConfig.of(config)
        self._saved = self._saved_seat()
        joined = None if self._saved is None else self._saved["joined"]
        self.membership = Membership(
            dht, options.run_id, options.ttl, joined=joined, key=self.key, config=self.shared
        )
        self.index = -1
        self.done = False
        self.neighbors: dict[int, str] = {}
        self.live_ids: set[str] = set()
        self.state: PeerState | None = None
        self.door: Door | None = None
        self._renewer = threading.Thread(target=self._renew, daemon=True)

    def _saved_seat(self) -> dict[str, Any] | None:
        """The seat a restarting peer held, if its state dir has one for this run."""
        saved = self.options.state_dir / "peer.json"
        if not saved.is_file():
            return None
        record = json.loads(saved.read_text())
        if record["run_id"] != self.options.run_id:
            raise PeerError(
                f"state dir {self.options.state_dir} belongs to run {record['run_id']!r}, "
                f"not {self.options.run_id!r}"
            )
        return record

    def take_seat(self) -> tuple[int, Members, float]:
        """This peer's client index, the members it knows of, and its join time; raises
        ConfigDiffers, naming the keys, when this peer's config is not the run's."""
        joined = self.membership.me.joined
        if self._saved is not None:
            self._check_config()
            self.index = self._saved["index"]
            self._renewer.start()
            return self.index, Members({}), joined
        self._renewer.start()
        initial = self.membership.initial(self.config.clients, self.options.start_timeout)
        if self.membership.me.peer_id in initial:
            self.index = initial.index(self.membership.me.peer_id)
            self.membership.announce(self.index)
            return self.index, Members.initial(initial, self._initial_keys(initial)), joined
        return *self._join(), joined

    def _initial_keys(self, initial: list[str]) -> list[str]:
        """The initial members' public keys, from their membership records: every one of them
        announced (with its key) before the initial list was drawn."""
        deadline = time.monotonic() + self.options.start_timeout
        while True:
            keys = {m.peer_id: m.key for m in self.membership.members() if m.key}
            if all(peer in keys for peer in initial) or time.monotonic() > deadline:
                return [keys.get(peer, "") for peer in initial]
            time.sleep(0.2)

    def _check_config(self) -> list[Member]:
        """Refuse this peer (ConfigDiffers) if the run's members, as the DHT shows them now,
        share another config; the members, for whoever asks them next."""
        members = self.membership.members()
        run = run_config(members, besides=self.membership.me.peer_id)
        if run is not None:
            self.shared.check(run)
        return members

    def _join(self) -> tuple[int, Members]:
        """Ask a live member to sponsor this peer; its admission (and public key) rides on the
        sponsor's next signed batch, so every member learns it before the steps it concerns.
        A sponsor refuses a peer with another config by answering with its own instead."""
        deadline = time.monotonic() + self.options.start_timeout
        me = self.membership.me
        proof = join_proof(self.signing_key, self.options.run_id, me.peer_id)
        request = Frame(
            {
                "peer": me.peer_id,
                "key": self.key,
                "proof": proof,
                "config": self.shared.to_record(),
            }
        ).encode()
        while time.monotonic() < deadline:
            for member in sorted(self._check_config(), key=lambda m: m.index):
                if member.index < 0 or member.peer_id == me.peer_id:
                    continue
                reply = self.link.request(member.peer_id, JOIN_PROTOCOL, request)
                if reply is None:
                    continue
                header = Frame.decode(reply).header
                if "refused" in header:
                    raise PeerError(
                        f"client {member.index} refused this peer: {str(header['refused'])[:200]}"
                    )
                if "index" not in header:  # refused for its config, else no honest member's reply
                    with contextlib.suppress(ConfigRecordError):
                        self.shared.check(SharedConfig.read(header.get("config")))
                    continue
                self.say(
                    f"admitted as client {header['index']} from step {header['first_step']} by "
                    f"client {member.index}"
                )
                self.index = header["index"]
                self.membership.announce(self.index)
                return header["index"], Members.from_json(header["members"])
            time.sleep(0.5)
        raise PeerError(f"no member of run {self.options.run_id!r} admitted this peer in time")

    def seated(self, state: PeerState, door: Door) -> None:
        """Hand over the member table and the door, which say who the neighbours can be."""
        self.state, self.door = state, door

    def _table(self) -> tuple[PeerState, Door]:
        if self.state is None or self.door is None:
            raise RuntimeError("neighbours are known only once the peer is seated")
        return self.state, self.door

    def _renew(self) -> None:
        """Keep this peer's record alive and follow who else is, and their keys."""
        while not self.stopping.is_set():
            try:
                self.membership.announce(self.index, self.done)
                records = self.membership.members()
            except Exception as exc:  # the DHT process is going down with us
                self.say(f"membership renewal failed: {exc}")
                records = None
            if records is not None and self.door is not None:
                with self.cond:
                    self.live_ids = {m.peer_id for m in records}
                    self._learn_keys({m.peer_id: m.key for m in records if m.key})
                    self.rewire()
            self.stopping.wait(self.options.ttl / 3)

    def _learn_keys(self, keys: dict[str, str]) -> None:
        """Fill in members' keys this peer lacks (a restarted peer's table may predate them)."""
        state, _ = self._table()
        found = {
            index: Seat(seat.peer_id, seat.first_step, key=keys[seat.peer_id])
            for index, seat in state.members.seats.items()
            if not seat.key and seat.peer_id in keys
        }
        if found:
            state.learn(Members(found))

    def look_around(self) -> None:
        """Take the live members from the DHT now rather than at the next renewal."""
        with self.cond:
            self.live_ids = {m.peer_id for m in self.membership.members()}
            self.rewire()

    def rewire(self) -> None:
        """Neighbours: the run's topology over the live members in index order, less any banned
        peer (which leaves a hole: the topology is not recomputed around an offender). A member
        removed from a step this peer has not committed yet still sends until then, so it keeps
        its place; `Node` rewires again once its last step is committed."""
        state, door = self._table()
        seats = state.members.seats
        needed = state.committed_step + 1
        live = sorted(
            i
            for i, seat in seats.items()
            if (seat.gone_from is None or needed < seat.gone_from)
            and (seat.peer_id in self.live_ids or i == state.me)
        )
        if len(live) < 2 or state.me not in live:
            self.neighbors = {}
            return
        try:
            topology = make_topology(self.config.topology, len(live), seed=self.config.seed)
        except TopologyError:
            topology = make_topology("ring", len(live))
        position = live.index(state.me)
        self.neighbors = {
            live[p]: seats[live[p]].peer_id
            for p in topology.neighbors[position]
            if seats[live[p]].peer_id not in door.banned
        }

    def others(self) -> list[str]:
        """Whom to ask for what is missing: the neighbours, else any live member not banned."""
        state, door = self._table()
        with self.cond:
            if self.neighbors:
                return list(self.neighbors.values())
            return [
                seat.peer_id
                for i, seat in state.members.seats.items()
                if i != state.me
                and seat.gone_from is None
                and seat.peer_id in self.live_ids
                and seat.peer_id not in door.banned
            ]

    def finish(self) -> None:
        """Tell the others this peer is done, so that they stop lingering for it."""
        self.done = True
        self.membership.announce(self.index, True)
