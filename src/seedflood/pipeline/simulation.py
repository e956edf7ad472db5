"""Discrete-event simulation of pipeline-parallel training under churn, routed by GWTF or SWARM.

One iteration: the router admits a batch of microbatches from the data holders (GWTF: one per path
of the injected planner; SWARM: as many as the smallest stage capacity allows, the batch a perfect
flow would route). Each microbatch runs forward through one relay per stage (relay.compute_s) and
backward in reverse (2 × compute_s); the last stage computes the loss and turns round at once. A
transfer takes latency + bytes / bandwidth between the two regions; links are not shared
resources, so concurrent transfers do not slow each other. A relay computes one task at a time,
first come first served. When every microbatch has finished its backward, each stage's replicas
average gradients: stage parameter bytes over the slowest link among its live replicas, stages in
parallel. That all-reduce is atomic: churn falling inside it takes effect when it ends.

GWTF (gwtf.md §5.2/5.3): relays pass activations along the planned path and keep each
microbatch's input, output and gradient until the iteration ends; a relay holds at most
``capacity`` microbatches between their forward and backward (more wait; recomputations do not
wait, as two microbatches could each hold the slot the other needs). Whoever waits on a
crashed relay notices after a timeout; the predecessor re-sends its kept activation (in backward
the successor also its kept gradient) to the cheapest live replacement of that stage, which
recomputes only that stage. Gradients lost with a crashed relay are recomputed the same way. The
next iteration is planned on the scenario without the dead: GWTF's planner repairs the flow it
had (routing.DecentralizedPlanner), or, to compare, plans afresh.

SWARM (swarm.py): stateless relays; a crash costs a timeout and a retry; the gradients a crashed
server had accumulated are lost, so its microbatches count as lost. Its prototype's trainer is a
hub (``Router.hub``): every stage input goes trainer → server and every output back. Without the
hub (swarm-direct), outputs go server → server as GWTF's do, and the sender of a stage's input
keeps it for that stage's stateless backward; a lost one is recomputed from the stage below.

The loop knows a router only by the routing.Router interface; picking GWTF or SWARM by name and
running it is routers.simulate's job, so this module imports no concrete router.

Within an iteration a relay is known dead (avoided by every router) once a timeout on it expired
or ``forward_timeout_s`` after its crash (heartbeats), whichever comes first; the next iteration
starts with every crash known.

Every second of a live relay is useful, recomputed (a stage forward or backward of a microbatch
already started once this iteration, SWARM's stateless re-forward included), discarded (lost in a
crash: the task in progress, every finished product the relay kept, and all the work on a
microbatch that a crash left out of some stage's average) or idle; ledger.py books it by cause.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from seedflood.pipeline.churn import ChurnEvent, Degrade, Join, Leave, describe
from seedflood.pipeline.costs import Relay, Scenario, ScenarioError
from seedflood.pipeline.ledger import Ledger
from seedflood.pipeline.records import (
    IterationRecord,
    Microbatch,
    MicrobatchKey,
    RelayState,
    SimResult,
    Task,
    TrainedMicrobatch,
    Wait,
)
from seedflood.pipeline.routing import Router

DEFERRED = "last relay of its stage: deferred until the stage has another"


class Simulation:
    """The event loop and the state of every relay and microbatch; routers decide the rest,
    reading it only as a routing.RoutingView."""

    def __init__(
        self,
        scenario: Scenario,
        router: Router,
        churn: Iterator[ChurnEvent],
        *,
        forward_timeout_s: float,
        backward_timeout_s: float,
        stage_parameter_bytes: int,
    ) -> None:
        self.scenario = scenario
        self.router = router
        self.churn = churn
        self.forward_timeout_s = forward_timeout_s
        self.backward_timeout_s = backward_timeout_s
        self.stage_parameter_bytes = stage_parameter_bytes
        self.now = 0.0
        self.states = {r.name: RelayState(r, 0.0, idle_since=0.0) for r in scenario.relays}
        self.known_dead: set[str] = set()
        self.ledger = Ledger()
        self.microbatches: list[Microbatch] = []
        self._open = 0
        self._heap: list[tuple[float, int, str, Any]] = []
        self._order = itertools.count()
        self._degraded: list[tuple[frozenset[str], float, float]] = []
        self._joins: list[Join] = []
        self._deferred: list[tuple[ChurnEvent, float]] = []
        self._log: list[dict[str, Any]] = []
        self._pull_churn()

    # What routers may read (routing.RoutingView), besides ``scenario`` and ``known_dead``.
    def usable(self, name: str) -> bool:
        """Serving, not leaving and not known dead (a silent crash still looks usable)."""
        state = self.states.get(name)
        return (
            state is not None
            and not state.leaving
            and name not in self.known_dead
            and (state.ended_s is None or state.crashed)
        )

    def has_free_slot(self, name: str) -> bool:
        state = self.states[name]
        return len(state.held) < state.relay.capacity

    # One iteration.
    def run_iteration(self, index: int) -> IterationRecord:
        self._log = []
        while self._heap and self._heap[0][0] <= self.now:
            self._step()
        start = self.now
        self._activate_joiners()
        self._apply_deferred()
        scenario, admitted = self.router.begin_iteration(self._live_scenario(), index)
        self._adopt(scenario)
        stages = scenario.stages
        per_holder: Counter[str] = Counter()
        self.microbatches = []
        for holder, path in admitted:
            self.microbatches.append(
                Microbatch(holder, per_holder[holder], list(path), [None] * stages, [None] * stages)
            )
            per_holder[holder] += 1
        self._open = len(self.microbatches)
        for mb in self.microbatches:
            self._advance(mb)
        while self._open:
            if not self._heap:
                raise RuntimeError("microbatches are stuck with nothing left to happen")
            self._step()
        compute_end = self.now
        end = compute_end + self._aggregation_s()
        trained, lost, duplicates = self._collect()
        self.ledger.drop(lost)
        for state in self.states.values():
            state.kept.clear()
            state.gradients.clear()
            state.held.clear()
        self.ledger.new_iteration()
        self.microbatches = []
        while self._heap and self._heap[0][0] < end:
            self._step(at=end)
        self.now = end
        for state in self.states.values():
            if state.leaving and state.ended_s is None:
                self._end_life(state)
        return IterationRecord(
            index,
            start,
            compute_end,
            end,
            len(admitted),
            trained,
            lost,
            duplicates,
            tuple(self._log),
        )

    def run(self, microbatches_target: int) -> SimResult:
        """Train until ``microbatches_target`` microbatches are in the averaged gradients."""
        records: list[IterationRecord] = []
        trained = 0
        while trained < microbatches_target:
            record = self.run_iteration(len(records))
            if not record.admitted:
                raise ScenarioError(f"iteration {record.index} admitted no microbatch")
            records.append(record)
            trained += record.microbatches
        return self.finish(records)

    def finish(self, records: Sequence[IterationRecord]) -> SimResult:
        for state in self.states.values():
            if state.ended_s is None:
                self._end_life(state)
        lifetimes = {
            name: (state.alive_since, state.ended_s if state.ended_s is not None else self.now)
            for name, state in self.states.items()
        }
        account = self.ledger.account(sum(end - begin for begin, end in lifetimes.values()))
        return SimResult(self.router.name, tuple(records), account, lifetimes)

    def _step(self, at: float | None = None) -> None:
        time, _, kind, payload = heapq.heappop(self._heap)
        self.now = max(self.now, time if at is None else at)
        getattr(self, f"_on_{kind}")(payload)

    def _push(self, time: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (time, next(self._order), kind, payload))

    def _pull_churn(self) -> None:
        event = next(self.churn, None)
        if event is not None:
            self._push(event.time_s, "churn", event)

    def _live_scenario(self) -> Scenario:
        """Who serves the next iteration. Membership is settled between iterations: the
        all-reduce needs every replica, so it reveals the crashed ones."""
        self.known_dead.update(name for name, state in self.states.items() if state.crashed)
        relays = tuple(state.relay for state in self.states.values() if state.ended_s is None)
        return self.scenario.with_relays(relays)

    def _adopt(self, scenario: Scenario) -> None:
        self.scenario = scenario
        for relay in scenario.relays:
            state = self.states[relay.name]
            if state.relay.stage != relay.stage:
                move = {"from_stage": state.relay.stage, "to_stage": relay.stage}
                self._log.append({"type": "rebalance", "relay": relay.name, **move})
            state.relay = relay

    def _activate_joiners(self) -> None:
        for join in self._joins:
            stage = self.router.place(join, self._live_scenario())
            relay = Relay(join.name, stage, join.compute_s, join.capacity, join.region)
            self.states[join.name] = RelayState(relay, self.now, idle_since=self.now)
            self._log.append({"type": "activate", "relay": join.name, "stage": stage})
        self._joins = []

    # Microbatch progress.
    def _advance(self, mb: Microbatch) -> None:
        """Start the microbatch's next task: the next forward stage, else the highest stage still
        lacking a gradient; first recomputing, in order, any lost output that task needs."""
        if mb.pending is not None or mb.done:
            return
        for name in {*mb.path, *mb.output_at, *mb.gradient_at} & self.known_dead:
            self._forget(mb, name)
        stages = len(mb.path)
        stateful = self.router.stateful
        relayed = not self.router.hub
        if mb.reached < stages - 1:
            target, backward = mb.reached + 1, False
        else:
            missing = [s for s in range(stages) if mb.gradient_at[s] is None]
            if not missing:
                self._finish(mb)
                return
            target, backward = max(missing), True
        stage = target
        while relayed and stage > 0 and mb.output_at[stage - 1] is None:
            stage -= 1
        if stage < target:
            self._dispatch(mb, stage, forward=True, backward=False)
        elif backward and stateful and mb.output_at[stage] is not None:
            self._dispatch(mb, stage, forward=False, backward=True)
        else:
            turn = backward or (stateful and stage == stages - 1)
            self._dispatch(mb, stage, forward=True, backward=turn)

    def _forget(self, mb: Microbatch, name: str) -> None:
        for stage in range(len(mb.path)):
            if mb.path[stage] == name:
                mb.path[stage] = None
            if not self.router.hub and mb.output_at[stage] == name:
                mb.output_at[stage] = None
            if not self.router.hub and mb.gradient_at[stage] == name:
                mb.gradient_at[stage] = None

    def _finish(self, mb: Microbatch) -> None:
        """Done, unless a GWTF relay keeping one of its gradients has crashed meanwhile."""
        if self.router.stateful:
            gone = sorted({n for n in mb.gradient_at if n and self.states[n].crashed})
            if gone:
                crashed_s = self.states[gone[0]].ended_s
                assert crashed_s is not None, "a crashed relay has an end"
                self._wait(mb, gone[0], at=max(self.now, crashed_s + self.backward_timeout_s))
                return
        mb.done = True
        self._open -= 1

    def _wait(self, mb: Microbatch, relay: str, *, at: float) -> None:
        wait = Wait(relay)
        mb.pending = wait
        self._push(at, "detect", (mb, wait))

    def _timeout_s(self, task: Task) -> float:
        return self.backward_timeout_s if task.backward else self.forward_timeout_s

    def _dispatch(self, mb: Microbatch, stage: int, *, forward: bool, backward: bool) -> None:
        relay = self.router.choose(mb, stage, not backward, self)
        mb.path[stage] = relay
        task = Task(mb, stage, relay, forward, backward, sent_s=self.now)
        sources = self._sources(mb, stage, forward, backward)
        ends = [relay, *(node for node, _ in sources)]
        dead = [n for n in ends if n in self.states and self.states[n].crashed]
        if dead:
            self._wait(mb, dead[0], at=self.now + self._timeout_s(task))
            return
        travel = max((self._transfer_s(node, relay, size) for node, size in sources), default=0.0)
        mb.pending = task
        self._push(self.now + travel, "arrive", task)

    def _sources(
        self, mb: Microbatch, stage: int, forward: bool, backward: bool
    ) -> list[tuple[str, int]]:
        """Who sends what for a task: a hub (SWARM's trainer) sends the stage input (and, for a
        backward, the output gradient too); otherwise relays send their kept output and gradient."""
        size = self.scenario.activation_bytes
        if self.router.hub:
            return [(mb.holder, 2 * size if backward else size)]
        sources = []
        if forward:
            sources.append((mb.output_at[stage - 1] if stage else mb.holder, size))
        if backward and stage + 1 < len(mb.path):
            sources.append((mb.gradient_at[stage + 1], size))
        assert all(node is not None for node, _ in sources), "a task lacks its inputs"
        return [(str(node), size) for node, size in sources]

    def _transfer_s(self, source: str, target: str, size: int) -> float:
        if source == target:
            return 0.0
        regions = (self.scenario.nodes[source].region, self.scenario.nodes[target].region)
        latency, bandwidth = self.scenario.link(*regions)
        pair = frozenset(regions)
        slowdown = max(
            (
                factor
                for where, factor, until in self._degraded
                if where == pair and until > self.now
            ),
            default=1.0,
        )
        return latency + size * slowdown / bandwidth

    # Relays.
    def _start_next(self, state: RelayState) -> None:
        if state.current is not None or not state.queue:
            return
        task = state.queue.popleft()
        if state.idle_since is not None:
            self.ledger.idle(self.now - state.idle_since)
            state.idle_since = None
        stateless = not self.router.stateful
        duration = self.ledger.start(task, state.relay.compute_s, stateless=stateless)
        task.started_s = self.now
        state.current = task
        self._push(self.now + duration, "done", task)

    def _end_life(self, state: RelayState) -> None:
        if state.idle_since is not None:
            self.ledger.idle(self.now - state.idle_since)
            state.idle_since = None
        if state.current is not None and state.current.started_s is not None:
            self.ledger.interrupted(self.now - state.current.started_s)
        state.ended_s = self.now

    def _crash(self, state: RelayState) -> None:
        name = state.relay.name
        self._end_life(state)
        state.crashed = True
        self.ledger.lose(state.kept)
        for container in (state.kept, state.gradients, state.held, state.queue, state.waiting):
            container.clear()
        state.current = None
        for mb in self.microbatches:
            pending = mb.pending
            if isinstance(pending, Task) and pending.relay == name and not pending.finished:
                pending.failed = True
                self._wait(mb, name, at=self.now + self._timeout_s(pending))
            elif mb.done and self.router.stateful and name in mb.gradient_at:
                mb.done = False
                self._open += 1
                self._wait(mb, name, at=self.now + self.backward_timeout_s)
        self._push(self.now + self.forward_timeout_s, "known_dead", name)

    # Events.
    def _on_arrive(self, task: Task) -> None:
        if task.failed:
            return
        state = self.states[task.relay]
        key = task.mb.key
        if self.router.stateful and task.forward and key not in state.held:
            if len(state.held) >= state.relay.capacity and task.stage > task.mb.reached:
                state.waiting.append(task)
                return
            state.held.add(key)
        state.queue.append(task)
        self._start_next(state)

    def _on_done(self, task: Task) -> None:
        if task.failed:
            return
        state = self.states[task.relay]
        state.current = None
        state.idle_since = self.now
        task.finished = True
        self.ledger.done(task)
        if not self.router.hub or task.backward:
            state.kept.append(task)
        if task.backward:
            state.gradients.append((task.mb.key, task.stage))
            state.held.discard(task.mb.key)
            while state.waiting and len(state.held) < state.relay.capacity:
                admitted = state.waiting.popleft()
                state.held.add(admitted.mb.key)
                state.queue.append(admitted)
        if not self.router.hub:
            self._on_result(task)
        else:
            reply = 0 if task.backward and task.stage == 0 else self.scenario.activation_bytes
            self._push(
                self.now + self._transfer_s(task.relay, task.mb.holder, reply), "result", task
            )
        self._start_next(state)

    def _on_result(self, task: Task) -> None:
        mb = task.mb
        if mb.pending is not task:
            return
        mb.pending = None
        self.router.observe(task, self.now - task.sent_s)
        if task.forward:
            mb.output_at[task.stage] = mb.holder if self.router.hub else task.relay
            mb.reached = max(mb.reached, task.stage)
        if task.backward:
            mb.gradient_at[task.stage] = task.relay
        self._advance(mb)

    def _on_detect(self, payload: tuple[Microbatch, Wait]) -> None:
        mb, wait = payload
        if mb.pending is not wait:
            return
        mb.pending = None
        self.known_dead.add(wait.relay)
        self.router.failed(mb, wait.relay, self.states[wait.relay].relay.stage)
        self._advance(mb)

    def _on_known_dead(self, name: str) -> None:
        self.known_dead.add(name)

    def _on_churn(self, event: ChurnEvent) -> None:
        self._pull_churn()
        record = describe(event)
        record["applied_s"] = self.now
        skipped = self._apply(event)
        if skipped == DEFERRED:
            self._deferred.append((event, self.now))
        if skipped:
            record["deferred" if skipped == DEFERRED else "skipped"] = skipped
        self._log.append(record)

    def _apply(self, event: ChurnEvent) -> str | None:
        """Apply one churn event; say why not when it cannot apply."""
        if isinstance(event, Degrade):
            self._degraded.append(
                (frozenset(event.regions), event.factor, self.now + event.duration_s)
            )
            return None
        if isinstance(event, Join):
            if event.name in self.states or any(j.name == event.name for j in self._joins):
                return "name already taken"
            self._joins.append(event)
            return None
        pending = [join for join in self._joins if join.name == event.relay]
        if pending:
            self._joins.remove(pending[0])
            return None
        state = self.states.get(event.relay)
        if state is None or state.ended_s is not None:
            return "relay is not serving"
        if isinstance(event, Leave) and state.leaving:
            return "relay is already leaving"
        staying = [
            peer
            for peer in self.states.values()
            if peer.relay.stage == state.relay.stage and peer.ended_s is None and not peer.leaving
        ]
        if not state.leaving and len(staying) < 2:
            return DEFERRED
        if isinstance(event, Leave):
            state.leaving = True
        else:
            self._crash(state)
        return None

    def _apply_deferred(self) -> None:
        """Crashes and departures that came while their relay was its stage's last, applied once
        a joiner or a rebalancing gave the stage another. Dropped instead, the schedule's
        generator (which counts the relay as gone) would never churn that relay again: each stage
        would keep one relay immune, and the real churn would fall below the nominal rate."""
        waiting, self._deferred = self._deferred, []
        for event, deferred_s in waiting:
            skipped = self._apply(event)
            if skipped is None:
                record = {**describe(event), "applied_s": self.now, "deferred_from_s": deferred_s}
                self._log.append(record)
            elif skipped == DEFERRED:
                self._deferred.append((event, deferred_s))
            else:
                self._log.append({**describe(event), "applied_s": self.now, "skipped": skipped})

    # End of iteration.
    def _aggregation_s(self) -> float:
        longest = 0.0
        members: dict[int, list[str]] = {}
        for name, state in self.states.items():
            if state.ended_s is None:
                members.setdefault(state.relay.stage, []).append(name)
        for names in members.values():
            for a, b in itertools.combinations(names, 2):
                longest = max(longest, self._transfer_s(a, b, self.stage_parameter_bytes))
        return longest

    def _collect(
        self,
    ) -> tuple[tuple[TrainedMicrobatch, ...], tuple[MicrobatchKey, ...], int]:
        """Which microbatches every stage's average really contains, read from the live relays'
        gradients rather than from the microbatches' own bookkeeping."""
        stages = self.scenario.stages
        holders: dict[MicrobatchKey, list[list[str]]] = {
            mb.key: [[] for _ in range(stages)] for mb in self.microbatches
        }
        for name, state in self.states.items():
            if not state.crashed:
                for key, stage in state.gradients:
                    holders[key][stage].append(name)
        trained, lost, duplicates = [], [], 0
        for key, per_stage in holders.items():
            duplicates += sum(len(names) > 1 for names in per_stage)
            if all(per_stage):
                trained.append(TrainedMicrobatch(*key, tuple(names[0] for names in per_stage)))
            else:
                lost.append(key)
        return tuple(trained), tuple(lost), duplicates
