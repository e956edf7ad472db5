"""One real SeedFlood client as pure state: its model, its message log and who takes part.

The network, processes and clocks live in `seedflood.peers.node`; everything that decides what the
model is lives here, so it can be tested by handing messages between states in one process.

Exact consensus. Step t is committed once this peer holds the message of every member expected at
t, in canonical order, so committed parameters are bit-identical on all peers. Who is expected
changes only through facts every peer learns before it can commit the step they concern:

- an **admission** (index, peer, first step) travels inside its sponsor's message of some step k
  and takes effect two rounds later; nobody commits a step after k without that message;
- a **departure** (index, from step) is declared by one sponsor once the peer vanished from the
  membership and after its last message was pulled from the neighbours; a commit that already
  used a message at or after that step is reported as a divergence, loudly.

Messages may also carry the sender's committed-state hash every ``hash_every`` rounds; a
mismatch with this peer's hash at the same step is a divergence too.
"""

from __future__ import annotations

import bisect
import json
import operator
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from torch import nn

from seedflood.algorithms.common import sample_batch
from seedflood.files import atomic_write_json
from seedflood.learning.models import state_hash
from seedflood.learning.schedules import Rate, as_rate
from seedflood.learning.scoring import TokenizedExample, loss_and_correct
from seedflood.peers.roster import Control, Members, Seat, admitted
from seedflood.peers.snapshot import restore_snapshot, save_snapshot
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.guard import DivergenceGuard, Tripped
from seedflood.protocol.ledger import LOG, apply_log
from seedflood.protocol.message_log import MessageLog
from seedflood.protocol.messages import Message, saturate
from seedflood.protocol.updates import Update, message_updates
from seedflood.zo import SubCGEDirection, applied, message_seed, two_point_estimate

Key = tuple[int, int]
ADMISSION_DELAY_ROUNDS = 2
HASHES_KEPT = 64


class NotAllowed(PermissionError):
    """A peer whose key the run's allowlist does not name asked for a seat."""


class DivergenceError(RuntimeError):
    """Committed states that should be equal are not."""


class PeerState:
    """The client ``me``: committed model and log, what it holds beyond them, and the members."""

    def __init__(
        self,
        *,
        me: int,
        members: Members,
        model: nn.Module,
        direction: SubCGEDirection,
        shard: Sequence[TokenizedExample],
        pad_id: int,
        state_dir: Path,
        clients: int,
        lr: float | Rate,
        eps: float | Rate,
        batch_size: int,
        local_steps: int,
        staleness: int,
        scalar_format: str,
        run_seed: int,
        hash_every: int = 10,
        snapshot_every: int = 100,
        on_divergence: Callable[[str], None] | None = None,
        clip: ScalarClip | None = None,
        guard: DivergenceGuard | None = None,
        allowed: frozenset[str] | None = None,
    ) -> None:
        self.me, self.clients = me, clients
        self.allowed = allowed
        self.model, self.direction = model, direction
        self.shard, self.pad_id = shard, pad_id
        self.lr, self.eps, self.batch_size = as_rate(lr), as_rate(eps), batch_size
        self.local_steps, self.staleness = local_steps, staleness
        self.scalar_format, self.run_seed = scalar_format, run_seed
        self.hash_every, self.snapshot_every = hash_every, snapshot_every
        self.on_divergence = on_divergence or (lambda text: None)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.members_path = state_dir / "members.json"
        self.snapshot_path = state_dir / "snapshot.pt"
        self.members = members
        self.log = MessageLog(state_dir / LOG)
        self.pending: dict[int, dict[int, Message]] = {}
        self.carried: dict[Key, list[Control]] = {}
        self.to_attach: list[Control] = []
        self.hashes: dict[int, str] = {}
        self.claims: dict[int, dict[int, str]] = {}
        self.divergences: list[str] = []
        # Removals this peer promised and has not seen decided, by client: their step. No step
        # from there on commits before the decision, so a peer cut off from the majority, which
        # promises to remove everyone it cannot hear, stalls instead of going on alone.
        self.undecided: dict[int, int] = {}
        self.saturated = 0
        self.refused_admissions = 0
        self.committed: list[Message] = []
        self.committed_step = -1
        self.clip = clip
        self.guard = guard
        self.tripped: Tripped | None = None
        self.replayed = self._restore()
        if self.members_path.is_file():
            self.learn(Members.from_json(json.loads(self.members_path.read_text())))
        self._save_members()

    def _save_members(self) -> None:
        atomic_write_json(self.members_path, self.members.to_json())

    def _apply(self, messages: Sequence[Message]) -> None:
        self.direction.apply(self._updates(messages))

    def _updates(self, messages: Sequence[Message]) -> list[Update]:
        return message_updates(messages, run_seed=self.run_seed, lr=self.lr, clients=self.clients)

    def _restore(self) -> int:
        """Rebuild the committed model: the latest snapshot, then the log after it (the log alone
        is the model; snapshots bound the replay, and one the log does not reach is set aside, so
        no step is applied twice). Returns how many messages were replayed."""
        self.committed = self.log.messages(0)
        start = restore_snapshot(self.snapshot_path, self.direction.matrices, len(self.committed))
        apply_log(
            self.direction,
            self.committed,
            run_seed=self.run_seed,
            lr=self.lr,
            clients=self.clients,
            clip=self.clip,
            guard=self.guard,
            start=start,
        )
        if self.committed:
            self.committed_step = self.committed[-1].step
        return len(self.committed) - start

    # -- rounds -------------------------------------------------------------------------------

    def round_of(self, step: int) -> int:
        return step // self.local_steps

    def ready_for(self, round_index: int) -> bool:
        """Staleness s: round r starts once every step of rounds before r − s is committed."""
        return self.committed_step >= (round_index - self.staleness) * self.local_steps - 1

    def own_rounds_done(self) -> int:
        """Rounds whose messages this client already made (committed, held, or fetched back
        from neighbours after a crash): a restart must not make them again."""
        mine = [m.step for m in self.committed if m.origin == self.me]
        mine += [step for step, held in self.pending.items() if self.me in held]
        return self.round_of(max(mine)) + 1 if mine else 0

    def originate(
        self, round_index: int, guard: AbstractContextManager[Any] | None = None
    ) -> tuple[list[Message], list[float]]:
        """This client's ``local_steps`` messages of the round and their losses. Each step sees
        the committed model plus the held messages of earlier rounds and this round's own earlier
        steps, as a simulated client does. ``guard`` (a lock) is held while the shared state is
        read and written, not during the forwards, so receiving goes on meanwhile."""
        guard = guard or nullcontext()
        messages, losses = [], []
        first = round_index * self.local_steps
        for step in range(first, first + self.local_steps):
            with guard:
                view = [
                    m
                    for t in sorted(self.pending)
                    if t < step
                    for o, m in sorted(self.pending[t].items())
                    if t < first or o == self.me
                ]
                if self.clip is not None:
                    view = self.clip.clip_pending(view, self.pending)
            batch = sample_batch(self.shard, self.me, step, self.batch_size, self.run_seed)
            with applied(self.direction, self._updates(view)):
                touch = self.direction.touch(message_seed(self.run_seed, self.me, step), step)
                scalar, loss = two_point_estimate(
                    lambda b=batch: loss_and_correct(self.model, b, self.pad_id)[0],
                    touch,
                    self.eps(step),
                )
            value, clamped = saturate(scalar, self.scalar_format)
            self.saturated += clamped
            message = Message(step, self.me, value)
            with guard:
                self.pending.setdefault(step, {})[self.me] = message
            messages.append(message)
            losses.append(loss)
        with guard:
            if self.to_attach:
                self._attach(messages[0])
        return messages, losses

    def admit(self, peer_id: str, key: str = "") -> int:
        """Sponsor a joiner: its admission (with its public key, so the sponsor's signature
        vouches for it) rides on this client's next message, and it takes part from two rounds
        after that message's round. Returns its client index; a key the run's allowlist does
        not name is refused (NotAllowed), as every other member would refuse its admission."""
        if self.allowed is not None and key not in self.allowed:
            raise NotAllowed(f"key {key[:16]}… is not in the run's allowlist")
        for index, seat in self.members.seats.items():
            if seat.peer_id == peer_id and seat.gone_from is None:
                return index
        queued = [c for c in self.to_attach if c["kind"] == "admit"]
        for control in queued:
            if control["peer"] == peer_id:
                return control["index"]
        index = max([self.members.next_index(), *(c["index"] + 1 for c in queued)])
        self.to_attach.append({"kind": "admit", "index": index, "peer": peer_id, "key": key})
        return index

    def _attach(self, carrier: Message) -> None:
        """Hand what waits to be said to this client's message ``carrier``."""
        for control in self.to_attach:
            if control["kind"] == "admit":
                round_index = self.round_of(carrier.step) + ADMISSION_DELAY_ROUNDS
                control["first_step"] = round_index * self.local_steps
                self.members.seats[control["index"]] = admitted(control)
                self._save_members()
        self.carried[carrier.key] = self.to_attach
        self.to_attach = []

    # -- receiving ----------------------------------------------------------------------------

    def receive(
        self, messages: Sequence[Message], carried: dict[Key, list[Control]]
    ) -> list[Message]:
        """Hold what is new; returns it (to be flooded on) in canonical order."""
        fresh = []
        for message in messages:
            seat = self.members.seats.get(message.origin)
            if message.step <= self.committed_step or message.origin in self.pending.get(
                message.step, {}
            ):
                continue
            if seat is not None and seat.gone_from is not None and message.step >= seat.gone_from:
                continue
            self.pending.setdefault(message.step, {})[message.origin] = message
            fresh.append(message)
            for control in carried.get(message.key, ()):
                self._take(message, control)
        return sorted(fresh)

    def _take(self, carrier: Message, control: Control) -> None:
        self.carried.setdefault(carrier.key, []).append(control)
        if control["kind"] == "admit":
            if self.allowed is not None and control.get("key") not in self.allowed:
                # a member sponsored a key the run does not admit: every honest peer leaves
                # the seat empty alike, and the stranger's batches are refused as not_member
                self.refused_admissions += 1
                return
            self.learn(Members({control["index"]: admitted(control)}))
        elif control["kind"] == "hash":
            self.claims.setdefault(control["step"], {})[carrier.origin] = control["hash"]
            self._check_claims(control["step"])

    def learn(self, members: Members) -> bool:
        """Take the admissions and departures another peer knows of; whether any was news."""
        changed = False
        for index, seat in members.seats.items():
            if index not in self.members.seats:
                self.members.seats[index] = Seat(seat.peer_id, seat.first_step, key=seat.key)
                changed = True
            elif seat.key and not self.members.seats[index].key:
                self.members.seats[index].key = seat.key  # the first key heard is kept
                changed = True
            if seat.gone_from is not None:
                changed |= self.depart(index, seat.gone_from)
        if changed:
            self._save_members()
        return changed

    def depart(self, index: int, from_step: int) -> bool:
        """Record that ``index`` takes no step from ``from_step`` on; whether it is news."""
        if not self.members.depart(index, from_step):
            return False
        self._save_members()
        used = [m for m in self.committed if m.origin == index and m.step >= from_step]
        if used:
            self._diverged(
                f"client {index} was declared gone from step {from_step}, but this peer already "
                f"committed its message of step {used[0].step}"
            )
        for step, held in self.pending.items():
            if step >= from_step:
                held.pop(index, None)
        return True

    def reinstate(self, index: int, gone_from: int | None) -> None:
        """Undo a promised departure that no majority can ever sign: ``index`` takes steps again
        up to ``gone_from`` (None: to the end). What the departure dropped comes back by pulls."""
        self.members.seats[index].gone_from = gone_from
        self._save_members()

    def missing(self) -> list[int]:
        """The members whose message of the next step to commit is not here yet."""
        step = self.committed_step + 1
        held = self.pending.get(step, {})
        return [i for i in self.members.expected(step) if i not in held]

    def last_step_of(self, index: int) -> int:
        """The last step of ``index`` before its first missing one, among what is held here."""
        step = self.committed_step
        while index in self.pending.get(step + 1, {}):
            step += 1
        return step

    # -- committing ---------------------------------------------------------------------------

    def commit(self) -> int:
        """Commit every complete step in canonical order; how many steps were committed."""
        before = self.committed_step
        while self.tripped is None:
            step = self.committed_step + 1
            if any(step >= held_from for held_from in self.undecided.values()):
                break
            expected = self.members.expected(step)
            held = self.pending.get(step, {})
            if not expected or any(index not in held for index in expected):
                break
            messages = [held[index] for index in expected]
            committed = messages if self.clip is None else self.clip.commit(messages)
            if self.guard is not None and (tripped := self.guard.check(step, committed)):
                self.tripped = tripped  # every peer refuses this same step: the run ends here
                break
            self._apply(committed)
            self.log.append(messages)
            self.committed += messages
            self.committed_step = step
            del self.pending[step]
            for index in held:
                self.carried.pop((step, index), None)
            if (step + 1) % (self.hash_every * self.local_steps) == 0:
                self.hashes[step] = self.state_hash()
                self.to_attach.append({"kind": "hash", "step": step, "hash": self.hashes[step]})
                self._check_claims(step)
        self.log.sync()
        for step in [t for t in self.claims if t <= self.committed_step and t not in self.hashes]:
            del self.claims[step]
        for step in sorted(self.hashes)[:-HASHES_KEPT]:
            del self.hashes[step]
        every = self.snapshot_every
        if every and (self.committed_step + 1) // every > (before + 1) // every:
            save_snapshot(self.snapshot_path, self.direction.matrices, len(self.log))
        return self.committed_step - before

    def _check_claims(self, step: int) -> None:
        mine = self.hashes.get(step)
        if mine is None:
            return
        for origin, claimed in sorted(self.claims.pop(step, {}).items()):
            if claimed != mine:
                self._diverged(
                    f"client {origin} committed state {claimed[:12]} after step {step}, this peer "
                    f"(client {self.me}) has {mine[:12]}"
                )

    def _diverged(self, text: str) -> None:
        self.divergences.append(text)
        self.on_divergence(text)

    # -- serving others -----------------------------------------------------------------------

    def held_since(self, step: int) -> tuple[list[Message], dict[Key, list[Control]]]:
        """Every message of steps >= ``step`` this peer has, committed or not, and what they
        carry: what a restarted, joining or lagging neighbour asks for."""
        start = bisect.bisect_left(self.committed, step, key=operator.attrgetter("step"))
        messages = self.committed[start:] + [
            m for t in sorted(self.pending) if t >= step for _, m in sorted(self.pending[t].items())
        ]
        keys = {m.key for m in messages}
        return messages, {key: c for key, c in self.carried.items() if key in keys}

    def state_hash(self) -> str:
        return state_hash(self.direction.matrices)
