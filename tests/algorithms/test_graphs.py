"""Batched forwards replayed from recorded graphs give the eager forwards' losses.

CUDA graphs exist only on a GPU; here an eager recorder stands in for them: its replay runs the
forward again over the graph's own input tensors, so a graph fed stale inputs (a copy forgotten
before a replay) gives another round's losses and fails these tests. The CUDA case of
test_seedflood.py's device test runs the real graphs.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from seedflood.algorithms.graphs import Forward, ForwardGraphs, Replay, forward_graphs
from seedflood.learning.models import load_model
from seedflood.learning.precision import forward_precision
from seedflood.topology import make_topology
from tests.algorithms.test_seedflood import make_seedflood


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def eager_record(forward: Forward) -> Replay:
    forward()  # as cuda_graph's warm-up does

    def replay(current: Forward) -> torch.Tensor:
        return current()

    return replay


def failing_record(forward: Forward) -> Replay:
    raise RuntimeError("operation not permitted when stream is capturing")


def rounds_with(
    tiny,
    graphs: ForwardGraphs | None,
    rounds: int,
    dtype: str = "bf16",
    device: str = "cpu",
    hops: int = 3,
    graphed_rounds: int | None = None,
):
    """Each round's estimates (taken before it) and the final hash of a 6-client ring run with
    48 rows a forward, its forwards in ``dtype`` on ``device``; at hops = 3, the diameter, one
    update per row: the path graphs record. With ``graphed_rounds``, only the rounds before it
    are handed the graphs; the rest run eagerly."""
    sim = make_seedflood(tiny, make_topology("ring", 6), hops=hops, batched=True)
    estimates = []
    with forward_precision(dtype), torch.device(device):  # as the runner computes rounds
        for round_index in range(rounds):
            graphed = graphed_rounds is None or round_index < graphed_rounds
            sim.graphs = graphs if graphed else None
            estimates.append(sim.estimates(round_index))
            sim.run_round(round_index)
    return estimates, sim.state_hash()


def assert_close(graphed: list, eager: list) -> None:
    """The same losses up to bf16's rounding, the rows of one forward padded otherwise: bf16
    keeps 8 significant bits (a relative spacing of 0.39%); on an H200's host CPU one loss moved
    by 0.20%."""
    for eager_round, graphed_round in zip(eager, graphed, strict=True):
        assert [loss for _, loss in graphed_round] == pytest.approx(
            [loss for _, loss in eager_round], rel=4e-3
        )


def test_graph_replays_give_the_eager_forwards_of_the_same_rows_bit_for_bit(tiny, caplog) -> None:
    """Rounds 0-2 share an epoch (refresh = 3) and one shape: seen at round 0's estimates,
    recorded at its forward, replayed after. Every round's perturbations differ, so a replay
    over stale inputs would repeat an earlier round's losses. A recorder that fails leaves the
    same padded rows to eager forwards: the reference, bit for bit."""
    graphs, failing = ForwardGraphs(record=eager_record), ForwardGraphs(record=failing_record)
    graphed = rounds_with(tiny, graphs, 6)
    with caplog.at_level(logging.WARNING, logger="seedflood.algorithms.graphs"):
        assert rounds_with(tiny, failing, 6) == graphed
    assert len({tuple(round_) for round_ in graphed[0]}) == 6
    assert (graphs.recorded, graphs.failure) == (2, None)  # one shape in each of two epochs
    assert graphs.replayed == 2 * 6 - 2  # two forwards a round, each epoch's first eager
    assert failing.recorded == failing.replayed == 0 and failing.graphs == {}
    assert "stream is capturing" in (failing.failure or "") and "run eagerly" in caplog.text
    unpadded = rounds_with(tiny, None, 6)
    assert_close(graphed[0], unpadded[0])
    assert graphed[1] != unpadded[1]  # padding moves last bits, and with them the run


def test_only_the_most_recently_replayed_graphs_are_kept(tiny) -> None:
    """Each epoch's basis is read where it lies, so an epoch is part of a graph's shape; with one
    graph kept, the second epoch's graph replaces the first's."""
    graphs = ForwardGraphs(record=eager_record, kept=1)
    rounds_with(tiny, graphs, 6)
    assert graphs.recorded == 2 and len(graphs.graphs) == 1
    ((epoch, *_),) = graphs.graphs
    assert epoch == 1


def test_fp32_forwards_stay_eager_bit_for_bit(tiny) -> None:
    graphs = ForwardGraphs(record=eager_record)
    assert rounds_with(tiny, graphs, 4, "fp32") == rounds_with(tiny, None, 4, "fp32")
    assert graphs.recorded == graphs.replayed == 0 and not graphs.seen


def test_forwards_no_graph_fits_run_unpadded_as_eager_ones(tiny) -> None:
    """Below the diameter a row carries several updates from round 1 on, their count varying
    between forwards: no graph fits, and those forwards are the eager path's, bit for bit, not
    padded copies (padded, they moved the run's last bits). Round 0's rows carry one update
    each: its one shape is recorded and replayed, padded, so the reference hands the graphs to
    round 0 alone (padding moves last bits on some CPUs: an Intel Xeon with AMX here, not the
    AVX2 AMD EPYC where this test first ran against a run without graphs)."""
    graphs = ForwardGraphs(record=eager_record)
    graphed = rounds_with(tiny, graphs, 4, hops=1)
    reference = ForwardGraphs(record=eager_record)
    assert graphed == rounds_with(tiny, reference, 4, hops=1, graphed_rounds=1)
    assert graphs.recorded == graphs.replayed == len(graphs.seen) == 1
    assert_close(graphed[0][:1], rounds_with(tiny, None, 1, hops=1)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA graphs")
def test_cuda_graphs_are_recorded_replayed_and_repeat_bit_for_bit(tiny) -> None:
    on_gpu = (copy.deepcopy(tiny[0]).to("cuda"), tiny[1])
    eager, _ = rounds_with(on_gpu, None, 6, device="cuda")
    graphs = forward_graphs(torch.device("cuda"))
    assert graphs is not None
    graphed, graphed_hash = rounds_with(on_gpu, graphs, 6, device="cuda")
    assert (graphs.recorded, graphs.replayed, graphs.failure) == (2, 10, None)
    assert_close(graphed, eager)
    again = rounds_with(on_gpu, forward_graphs(torch.device("cuda")), 6, device="cuda")
    assert again[1] == graphed_hash
