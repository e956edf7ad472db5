"""What a peer hands out when its run ends: the committed model and the ledger's manifest beside
its log (so that `seedflood replay STATE_DIR` rebuilds the model from the log alone), and
results.json, the record `seedflood launch` merges and `seedflood report` reads."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from seedflood import __version__
from seedflood.files import atomic_write_json
from seedflood.learning.models import save_model
from seedflood.learning.scoring import accuracy, majority_rate
from seedflood.peers.p2p import SYNC_PROTOCOL
from seedflood.protocol.guard import guard_record
from seedflood.protocol.ledger import write_manifest
from seedflood.protocol.traffic import EdgeTraffic, edge_summary

if TYPE_CHECKING:
    import threading

    import torch

    from seedflood.build import Parts
    from seedflood.config import RunConfig
    from seedflood.peers.batch_exchange import Exchange
    from seedflood.peers.inbox import Door
    from seedflood.peers.options import PeerOptions
    from seedflood.peers.p2p import Link
    from seedflood.peers.quorum import Quorum
    from seedflood.peers.seats import Seating
    from seedflood.peers.state import PeerState

__all__ = ["PeerRecords"]


class PeerRecords:
    """The end-of-run records of a `seedflood.peers.node.Node`, which is one: kept apart so the
    loop reads on its own. The attributes are the node's."""

    config: RunConfig
    options: PeerOptions
    parts: Parts
    state: PeerState
    cond: threading.Condition
    door: Door
    quorum: Quorum
    exchange: Exchange
    link: Link
    seating: Seating
    device: torch.device
    local_steps: int
    base_hash: str
    zero_shot: float
    longest_stall: float

    def accuracy(self, examples: list) -> float:
        config = self.config
        return accuracy(self.state.model, examples, self.parts.pad_id, config.eval_batch_size)

    def hand_out(self) -> dict[str, Any]:
        """The committed model in STATE_DIR/model and the ledger's manifest beside its log, so
        that `seedflood replay STATE_DIR` rebuilds the model from the log alone."""
        state, state_dir = self.state, self.options.state_dir
        with self.cond:
            state.log.sync()
            manifest = write_manifest(
                state_dir,
                self.config.model_dump(mode="json"),
                local_steps=self.local_steps,
                warmup_steps=self.config.warmup,
                base_hash=self.base_hash,
                state_hash=state.state_hash(),
                messages=len(state.log),
            )
            if self.config.save_model:
                save_model(self.parts.model, self.parts.tokenizer, state_dir / "model")
        return {"ledger_messages": manifest["messages"], "ledger_bytes": manifest["log_bytes"]}

    def traffic(self) -> dict[str, Any]:
        """The network side of results.json: bytes per edge, repair, signatures, link faults."""
        with self.cond:
            edges = {key: EdgeTraffic(**vars(edge)) for key, edge in self.exchange.edges.items()}
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
            "signature_bytes_sent": self.exchange.signature_bytes,
            "link_faults": self.link.fault_counts(),
        }

    def peer_results(self, started: float, train_seconds: float) -> dict[str, Any]:
        state, config, parts = self.state, self.config, self.parts
        results: dict[str, Any] = {
            "kind": "peer",
            "method": config.name,
            "version": __version__,
            "run_id": self.options.run_id,
            "client": state.me,
            "peer_id": self.seating.membership.me.peer_id,
            "state_hash": state.state_hash(),
            "committed_step": state.committed_step,
            "clipped_messages": state.clip.clipped if state.clip is not None else 0,
            "saturated_scalars": state.saturated,
            "refused_admissions": state.refused_admissions,
            "guard": guard_record(state.guard, state.tripped),
            "rounds": config.rounds,
            "steps": config.rounds * self.local_steps,
            "clients": config.clients,
            "topology": config.topology,
            "members": state.members.to_json(),
            "divergences": state.divergences,
            "replayed": state.replayed,
            "rejected": dict(self.door.rejected),
            "removals": self.quorum.record(),
            "longest_stall_seconds": self.longest_stall,
            "banned": dict(self.door.banned),
            "messages_committed": len(state.committed),
            "wall_seconds": time.perf_counter() - started,
            "train_seconds": train_seconds,
            "device": str(self.device),
            "data_source": parts.data_source,
            "config": config.model_dump(),
        }
        if self.options.evaluate:
            results["zero_shot_accuracy"] = self.zero_shot
            results["majority_accuracy"] = majority_rate(parts.test)
            results["accuracy"] = self.accuracy(parts.test)
        results.update(self.traffic())
        atomic_write_json(self.options.out_dir / "results.json", results)
        return results
