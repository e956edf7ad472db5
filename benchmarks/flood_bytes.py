"""Bytes per edge that SeedFlood sends in the paper's setting, computed by flooding real packets.

The paper reports about 400 KB per edge for a 16-client ring over 5,000 ZO steps. This floods one
message per client per step through the real codec and simulated network (no model: the scalar
values do not change packet sizes) and prints the busiest edge's total for several packings.

    python benchmarks/flood_bytes.py [--clients 16] [--steps 5000] [--out results/bench]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from seedflood.files import atomic_write_json
from seedflood.protocol.flooding import FloodState, flood
from seedflood.protocol.messages import Message
from seedflood.sim.network import SimulatedNetwork
from seedflood.topology import make_topology

PAPER_BYTES_PER_EDGE = 400_000


def flood_run(clients: int, steps: int, local_steps: int, scalar_format: str) -> dict[str, float]:
    topology = make_topology("ring", clients)
    network = SimulatedNetwork(topology.neighbors, scalar_format)
    states = [FloodState(i, topology.neighbors[i]) for i in range(clients)]
    rng = random.Random(0)
    for first in range(0, steps, local_steps):
        for step in range(first, min(first + local_steps, steps)):
            for client, state in enumerate(states):
                state.originate(Message(step, client, rng.gauss(0.0, 1.0)))
        flood(states, network, topology.diameter)
    summary = network.summary()
    return {
        "local_steps": local_steps,
        "scalar_format": scalar_format,
        "bytes_per_edge_max": summary["bytes_per_edge_max"],
        "messages_per_edge_max": summary["messages_per_edge_max"],
        "bytes_per_message": summary["bytes_per_edge_max"] / summary["messages_per_edge_max"],
        "header_bytes_per_edge_max": summary["header_bytes_per_edge_max"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [
        flood_run(args.clients, args.steps, local_steps, scalar_format)
        for local_steps, scalar_format in ((1, "fp32"), (5, "fp32"), (5, "fp16"), (5, "bf16"))
    ]
    print(f"ring of {args.clients}, {args.steps} steps, hops = diameter (paper: 400 KB per edge)")
    print(f"{'steps/round':>11} {'scalar':>6} {'bytes/edge':>11} {'msgs/edge':>9} {'B/msg':>6}")
    for row in rows:
        print(
            f"{row['local_steps']:>11} {row['scalar_format']:>6} "
            f"{row['bytes_per_edge_max']:>11,.0f} {row['messages_per_edge_max']:>9,.0f} "
            f"{row['bytes_per_message']:>6.2f}"
        )
    atomic_write_json(
        args.out / "flood_bytes.json",
        {
            "clients": args.clients,
            "steps": args.steps,
            "topology": "ring",
            "paper_bytes_per_edge": PAPER_BYTES_PER_EDGE,
            "rows": rows,
            "seconds": time.perf_counter() - started,
        },
    )


if __name__ == "__main__":
    main()
