"""Seconds the simulator spends flooding one round: every client originates one message and the
network carries them hops = diameter hops on a ring, packets encoded and decoded as a wire would.

No model is involved: this is the part of a simulated round that is neither forwards nor the
commit, and at 128 clients it was a third of a GPU round (docs/performance.md). Prints the median
of --rounds rounds per client count and writes OUT/flood_time.json:

    .venv/bin/python benchmarks/flood_time.py --clients 16 128 --out results/bench
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from timing import machine

from seedflood.files import atomic_write_json
from seedflood.protocol.flooding import FloodState, flood
from seedflood.protocol.messages import Message
from seedflood.sim.network import SimulatedNetwork
from seedflood.topology import make_topology


def round_seconds(clients: int, rounds: int) -> list[float]:
    """Seconds per flooded round, one network and one set of flood states for all rounds."""
    topology = make_topology("ring", clients)
    network = SimulatedNetwork(topology.neighbors)
    states = [FloodState(i, topology.neighbors[i]) for i in range(clients)]
    seconds = []
    for step in range(rounds):
        started = time.perf_counter()
        for state in states:
            state.originate(Message(step, state.me, 0.01 * (state.me % 7 - 3)))
        flood(states, network, topology.diameter)
        seconds.append(time.perf_counter() - started)
        for state in states:
            state.forget_before(step + 1)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    rows = []
    for clients in args.clients:
        seconds = round_seconds(clients, args.rounds)
        rows.append({"clients": clients, "median_s": statistics.median(seconds), "all": seconds})
        print(f"{clients:>5} clients: {statistics.median(seconds):.4f} s per round (median)")
    name = f"flood_time{'_' + args.label if args.label else ''}.json"
    atomic_write_json(args.out / name, {"machine": machine(), "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
    main()
