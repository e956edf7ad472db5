"""The simulator's anti-entropy driver: after each round's flooding hops, neighbours exchange
digests (`seedflood.protocol.antientropy`) over the same faulty links and pull what fault-free
flooding would already have delivered, until nothing is owed or the round's exchange budget is
spent. Its bytes are counted apart from the flood's."""

from __future__ import annotations

from collections.abc import Sequence

from seedflood.protocol.antientropy import Pending, decode_digest, digest_of, encode_digest
from seedflood.protocol.flooding import FloodState, origins
from seedflood.protocol.messages import Message, decode_packet
from seedflood.protocol.traffic import Packet, TrafficCounter
from seedflood.sim.network import SimulatedNetwork
from seedflood.topology import Topology


class AntiEntropy:
    """Digest-and-pull repair for the simulator, with its own per-edge byte counts and a record
    of how many exchanges each round needed."""

    def __init__(self, topology: Topology, *, local_steps: int, hops: int) -> None:
        self.n = topology.n
        self.neighbors = topology.neighbors
        self.local_steps, self.hops = local_steps, hops
        self.diameter = topology.diameter
        distances = topology.hop_distances
        self._within = [
            [
                sum(1 << o for o in range(self.n) if distances[client][o] <= d)
                for d in range(self.diameter + 1)
            ]
            for client in range(self.n)
        ]
        self.counter = TrafficCounter(self.neighbors)
        self.exchanges: list[int] = []
        self.unfinished: list[int] = []
        self.last_round = -1
        self.repaired = 0

    def due(self, client: int, step: int, round_index: int) -> int:
        """Origins whose message of ``step`` fault-free flooding has brought ``client`` by the end
        of round ``round_index``: those within ``hops`` per round elapsed."""
        budget = self.hops * (round_index - step // self.local_steps + 1)
        return self._within[client][min(max(budget, 0), self.diameter)]

    def missing(
        self, floods: Sequence[FloodState], pending: Pending, round_index: int
    ) -> list[int]:
        """Per client, how many messages it should hold by now and does not. A client knows
        this itself: it knows who takes part and which steps were made."""
        lacking = [0] * len(floods)
        for step, made in pending.items():
            made_mask = sum(1 << origin for origin in made)
            for client, state in enumerate(floods):
                due = self.due(client, step, round_index) & made_mask
                lacking[client] += (due & ~state.held(step)).bit_count()
        return lacking

    def repairable(
        self,
        floods: Sequence[FloodState],
        pending: Pending,
        network: SimulatedNetwork,
        round_index: int,
    ) -> bool:
        """Whether some live edge joins a client lacking a due message to one holding it; if
        none does (a partition), further exchanges cannot help this round."""
        for holder, row in enumerate(self.neighbors):
            for lacking in row:
                if not network.live(holder, lacking):
                    continue
                for step in pending:
                    held = floods[holder].held(step) & ~floods[lacking].held(step)
                    if held & self.due(lacking, step, round_index):
                        return True
        return False

    def exchange(
        self,
        floods: Sequence[FloodState],
        pending: Pending,
        network: SimulatedNetwork,
        round_index: int,
    ) -> int:
        """One exchange: every client that lacks a due message sends its digest to every
        neighbour, and each neighbour answers with the due messages the digest lacks. Returns how
        many messages were new to someone."""
        digests: list[Packet] = []
        lacking = self.missing(floods, pending, round_index)
        for client, state in enumerate(floods):
            if not lacking[client]:
                continue
            digest = encode_digest(digest_of(state, self.n))
            for neighbor in self.neighbors[client]:
                self.counter.count(client, neighbor, size=len(digest), messages=0)
                digests.append((client, neighbor, digest))
        answers: dict[int, dict[int, dict[tuple[int, int], Message]]] = {}
        for requester, holder, data in network.carry("digest", digests):
            lacks = decode_digest(data)
            wanted = answers.setdefault(holder, {}).setdefault(requester, {})
            for step, messages in pending.items():
                mask = floods[holder].held(step) & ~lacks.held(step)
                for origin in origins(mask & self.due(requester, step, round_index)):
                    wanted[(step, origin)] = messages[origin]
        outboxes = {
            holder: {requester: sorted(wanted.values()) for requester, wanted in rows.items()}
            for holder, rows in answers.items()
        }
        for holder, rows in outboxes.items():
            for requester, messages in rows.items():
                floods[holder].withdraw(requester, (m.key for m in messages))
        new = 0
        for holder, requester, packet in network.carry(
            "repair", network.send(outboxes, self.counter)
        ):
            messages = decode_packet(packet)[0]
            new += len(floods[requester].receive(holder, messages, forward=False))
        self.repaired += new
        return new

    def repair(
        self,
        floods: Sequence[FloodState],
        pending: Pending,
        network: SimulatedNetwork,
        round_index: int,
        limit: int,
    ) -> int:
        """Exchanges until every client holds what is due, no live edge can repair more, or
        ``limit`` exchanges ran; records and returns how many ran."""
        done = 0
        while done < limit and any(self.missing(floods, pending, round_index)):
            done += 1
            progress = self.exchange(floods, pending, network, round_index)
            if not progress and not self.repairable(floods, pending, network, round_index):
                break
        self.exchanges.append(done)
        self.last_round = round_index
        if any(self.missing(floods, pending, round_index)):
            self.unfinished.append(round_index)
        return done

    def summary(self) -> dict[str, float]:
        """Repair traffic per undirected edge, digests included, apart from flood traffic."""
        traffic = self.counter.summary()
        return {
            "repair_bytes_per_edge_max": traffic["bytes_per_edge_max"],
            "repair_bytes_per_edge_mean": traffic["bytes_per_edge_mean"],
            "repaired_messages": float(self.repaired),
        }

    def describe(self) -> dict[str, float | int | None]:
        """How hard repair worked: exchanges per round, and the round from which every round
        ended in full delivery (None while the last round did not)."""
        last = self.unfinished[-1] if self.unfinished else -1
        rounds = len(self.exchanges)
        return {
            "repair_exchanges_mean": sum(self.exchanges) / rounds if rounds else 0.0,
            "repair_exchanges_max": max(self.exchanges, default=0),
            "rounds_without_full_delivery": len(self.unfinished),
            "full_delivery_round": None
            if self.unfinished and last == self.last_round
            else last + 1,
        }
