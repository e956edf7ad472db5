"""Gossip baselines: DSGD, ChocoSGD and DZSGD against their definitions, on the tiny model."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from seedflood.algorithms.batched import row_weight_losses
from seedflood.algorithms.common import sample_batch
from seedflood.algorithms.gossip import (
    CHUNK,
    Gossip,
    gossip_memory_bytes,
    mixed_chunks,
    mixing_operator,
)
from seedflood.config import ConfigError, RunConfig
from seedflood.learning.models import add_lora, load_model
from seedflood.learning.scoring import batch_loss, loss_and_correct, tokenize
from seedflood.learning.tasks import Example, partition
from seedflood.protocol.guard import DivergenceGuard
from seedflood.sim.runner import check_memory
from seedflood.topology import Topology, make_topology
from seedflood.zo import DenseDirection, message_seed

WORDS = ["good", "bad", "fine", "awful", "great", "poor"]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def shards_for(tokenizer, n: int) -> list:
    examples = [
        Example(f"It was {WORDS[k % 6]} and {WORDS[(k * 5) % 6]}. It was", (" bad", " good"), k % 2)
        for k in range(6 * n)
    ]
    return [tokenize(tokenizer, shard, 32) for shard in partition(examples, n, seed=0)]


def make_gossip(
    tiny, topology: Topology, model: nn.Module | None = None, trainable=None, **kw
) -> Gossip:
    """A Gossip over ``model`` (a copy of the tiny model unless given) and its ``trainable``."""
    tokenizer = tiny[1]
    model = model or copy.deepcopy(tiny[0])
    trainable = trainable or list(model.parameters())
    options = {
        "estimator": "gradient",
        "lr": 0.05,
        "eps": 1e-3,
        "batch_size": 3,
        "local_steps": 1,
        "mixing": "metropolis",
        "topk_ratio": None,
        "gamma": 1.0,
        "run_seed": 4,
    }
    options.update(kw)
    return Gossip(
        model=model,
        trainable=trainable,
        topology=topology,
        shards=shards_for(tokenizer, topology.n),
        pad_id=tokenizer.pad_token_id,
        **options,
    )


@pytest.mark.slow
def test_dsgd_on_a_complete_graph_is_centralized_sgd_on_the_average(tiny) -> None:
    topology = make_topology("complete", 4)
    gossip = make_gossip(tiny, topology)
    reference = copy.deepcopy(tiny[0])
    params = list(reference.parameters())
    for p in params:
        p.requires_grad_(True)
    for step in range(3):
        gossip.run_round(step)
        grads = [torch.zeros_like(p) for p in params]
        for client in range(4):
            batch = sample_batch(gossip.shards[client], client, step, 3, 4)
            reference.zero_grad()
            batch_loss(reference, batch, gossip.pad_id).backward()
            for total, p in zip(grads, params, strict=True):
                total += p.grad / 4
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= 0.05 * g
    expected = torch.cat([p.detach().flatten() for p in params])
    for row in gossip.x:
        assert torch.allclose(row, expected, atol=1e-6)
    assert gossip.consensus_distance() < 1e-9
    assert not torch.allclose(expected, torch.cat([p.flatten() for p in tiny[0].parameters()]))


@pytest.mark.slow  # many gossip rounds of two full methods (about 12 s)
def test_choco_with_full_ratio_and_unit_gamma_is_dsgd(tiny) -> None:
    topology = make_topology("ring", 6)
    dsgd = make_gossip(tiny, topology)
    choco = make_gossip(tiny, topology, topk_ratio=1.0, gamma=1.0)
    for round_index in range(3):
        dsgd.run_round(round_index)
        choco.run_round(round_index)
    assert torch.allclose(choco.x, dsgd.x, atol=1e-6)
    assert dsgd.consensus_distance() > 0
    assert choco.traffic()["bytes_per_edge_max"] == 2 * 3 * dsgd.d * 8


def test_choco_top_k_sends_k_values_and_indices(tiny) -> None:
    topology = make_topology("ring", 4)
    choco = make_gossip(tiny, topology, topk_ratio=0.03, gamma=0.5)
    choco.run_round(0)
    k = round(0.03 * choco.d)
    assert choco.describe()["bytes_per_message"] == k * (4 + 4)
    changed = (choco.x_hat != 0).sum(dim=1)
    assert all(0 < int(c) <= k for c in changed)


@pytest.mark.slow
def test_dzsgd_sends_every_parameter_in_fp32(tiny) -> None:
    topology = make_topology("ring", 5)
    dzsgd = make_gossip(tiny, topology, estimator="zo", lr=1e-3)
    for round_index in range(2):
        dzsgd.run_round(round_index)
    d = sum(p.numel() for p in tiny[0].parameters())
    assert dzsgd.d == d and dzsgd.describe()["bytes_per_message"] == 4 * d
    traffic = dzsgd.traffic()
    assert traffic["messages_per_edge_max"] == 2 * 2
    assert traffic["bytes_per_edge_max"] == traffic["bytes_per_edge_mean"] == 2 * 2 * 4 * d
    assert dzsgd.consensus_distance() > 0


def test_dzsgd_local_step_is_mezos_update_with_the_messages_seed(tiny) -> None:
    """x ← x − η g u, with u drawn once from the (run seed, client, step) seed and g the two-point
    estimate on the client's minibatch, computed by hand here."""
    topology = make_topology("ring", 3)
    dzsgd = make_gossip(tiny, topology, estimator="zo", lr=1e-2)
    before = dzsgd.x[1].clone()
    dzsgd.local_step(1, 0)
    batch = sample_batch(dzsgd.shards[1], 1, 0, dzsgd.batch_size, dzsgd.run_seed)
    dzsgd._bind(before.clone())
    u = torch.cat(
        [
            v.flatten()
            for v in DenseDirection(dzsgd.params)
            .touch(message_seed(dzsgd.run_seed, 1, 0), 0)
            .values
        ]
    )
    losses = []
    for sign in (1.0, -1.0):
        dzsgd._bind(before + (u * (sign * dzsgd.eps(0))))
        losses.append(loss_and_correct(dzsgd.model, batch, dzsgd.pad_id)[0])
    g = (losses[0] - losses[1]) / (2 * dzsgd.eps(0))
    assert g != 0
    assert torch.equal(dzsgd.x[1], before + u * (-dzsgd.lr(0) * g))
    assert torch.equal(dzsgd.x[0], dzsgd.x[2])


def test_lora_variants_train_and_send_only_the_adapters(tiny) -> None:
    model = copy.deepcopy(tiny[0])
    base = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = add_lora(model, rank=8, alpha=16, targets=("q_proj", "v_proj"), seed=0)
    # 2 layers × (q: 8×64 + 64×8, v: 8×64 + 32×8 with 2 kv heads of 16)
    assert sum(p.numel() for p in adapters) == 2 * ((8 * 64 + 64 * 8) + (8 * 64 + 32 * 8))
    gossip = make_gossip(
        tiny, make_topology("ring", 4), model=model, trainable=adapters, lr=0.1, local_steps=2
    )
    gossip.run_round(0)
    assert gossip.describe()["bytes_per_message"] == 4 * 3584
    assert gossip.describe()["mixing_operator"] == "sparse"  # on the CPU
    assert gossip.traffic()["bytes_per_edge_max"] == 2 * 4 * 3584
    after = {
        k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if "lora_" not in k
    }
    assert after.keys() == base.keys()
    assert all(torch.equal(base[k], after[k]) for k in base)
    assert gossip.consensus_distance() > 0


def lora_dzsgd(tiny, topology: Topology, batched: bool) -> Gossip:
    model = copy.deepcopy(tiny[0])
    adapters = add_lora(model, rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=0)
    return make_gossip(
        tiny,
        topology,
        model=model,
        trainable=adapters,
        estimator="zo",
        lr=0.5,
        eps=1e-2,
        local_steps=2,
        batched=batched,
    )


def test_adapters_of_every_row_score_as_if_bound_one_at_a_time(tiny) -> None:
    gossip = lora_dzsgd(tiny, make_topology("ring", 3), batched=True)
    weights = torch.randn(5, gossip.d, generator=torch.Generator().manual_seed(0)) * 0.3
    batches = [gossip.shards[s % 3][: 2 + s % 2] for s in range(5)]
    batched = row_weight_losses(gossip.model, gossip.params, weights, batches, gossip.pad_id, 40)
    one_at_a_time = []
    for row, batch in zip(weights, batches, strict=True):
        gossip._bind(row.clone())
        one_at_a_time.append(loss_and_correct(gossip.model, batch, gossip.pad_id)[0])
    assert batched == pytest.approx(one_at_a_time, abs=1e-5)
    assert max(one_at_a_time) - min(one_at_a_time) > 1e-3


def test_batched_dzsgd_lora_takes_the_steps_of_one_client_at_a_time(tiny) -> None:
    topology = make_topology("ring", 5)
    batched, single = lora_dzsgd(tiny, topology, True), lora_dzsgd(tiny, topology, False)
    initial = batched.x.clone()
    for round_index in range(3):
        loss = batched.run_round(round_index)["train_loss"]
        assert loss == pytest.approx(single.run_round(round_index)["train_loss"], abs=1e-5)
    assert (single.x - initial).abs().max() > 1e-2
    assert torch.allclose(batched.x, single.x, atol=1e-4)
    assert batched.consensus_distance() == pytest.approx(single.consensus_distance(), rel=1e-3)


@pytest.mark.parametrize("variant", ["lora-batched", "lora-one-by-one", "full"])
def test_replaying_the_logged_scalars_ends_on_the_run_bit_for_bit(tiny, variant: str) -> None:
    """A zeroth-order round is a function of its start and its scalars: redone from them with no
    forward pass, it leaves every row and the traffic counts where the run left them."""
    topology = make_topology("ring", 4)

    def build() -> Gossip:
        if variant == "full":
            return make_gossip(tiny, topology, estimator="zo", eps=1e-2, local_steps=2)
        return lora_dzsgd(tiny, topology, batched=variant == "lora-batched")

    ran, replayed = build(), build()
    assert torch.equal(ran.x, replayed.x)
    for round_index in range(3):
        ran.run_round(round_index)
        scalars = ran.take_scalars()
        assert len(scalars) == 4 * 2 and len(set(scalars)) == len(scalars)
        replayed.replay_round(round_index, scalars)
        assert torch.equal(ran.x, replayed.x)
    assert ran.take_scalars() == []
    assert (ran.x - build().x).abs().max() > 1e-3
    assert replayed.traffic() == ran.traffic()


@pytest.mark.parametrize("workers", [1, 3])
def test_directions_drawn_ahead_leave_every_row_where_drawing_in_turn_does(tiny, workers) -> None:
    """Full DZSGD's directions drawn on worker threads (seedflood.zo.ahead) are the same values:
    stepping and replaying end bit for bit where drawing each when needed does."""
    topology = make_topology("ring", 4)

    def build(draw_workers: int) -> Gossip:
        return make_gossip(
            tiny, topology, estimator="zo", eps=1e-2, local_steps=2, draw_workers=draw_workers
        )

    in_turn, ahead, replayed = build(0), build(workers), build(workers)
    for round_index in range(2):
        in_turn.run_round(round_index)
        ahead.run_round(round_index)
        scalars = ahead.take_scalars()
        assert scalars == in_turn.take_scalars()
        replayed.replay_round(round_index, scalars)
    assert torch.equal(ahead.x, in_turn.x) and torch.equal(replayed.x, in_turn.x)
    assert (in_turn.x - build(0).x).abs().max() > 1e-3


def test_replay_refuses_a_gradient_run_and_a_round_of_the_wrong_size(tiny) -> None:
    zo = lora_dzsgd(tiny, make_topology("ring", 3), batched=True)
    with pytest.raises(ValueError, match="replays from 6 scalars"):
        zo.replay_round(0, [0.1] * 5)
    gradient = make_gossip(tiny, make_topology("ring", 3))
    gradient.run_round(0)
    assert gradient.take_scalars() == []
    with pytest.raises(ValueError, match="gradient run"):
        gradient.replay_round(0, [0.1] * 3)


def test_the_guard_reads_each_step_of_a_round_and_stops_the_run_after_that_round(tiny) -> None:
    """Two local steps a round, replayed from scalars (no forward pass): a calm round passes, and
    the second step of the next round, at ten times the median before it, trips the guard; the
    round is completed, so the run keeps that step, and says so. First-order gossip makes no
    scalars to guard."""
    guard = DivergenceGuard(factor=8.0, window=4, warmup=2)
    zo = make_gossip(tiny, make_topology("ring", 3), estimator="zo", local_steps=2, guard=guard)
    zo.replay_round(0, [1.0, -1.0, 1.0, 1.0, 1.0, -1.0])
    assert zo.stop_reason() is None and zo.describe()["guard"] == {"action": "none"}
    zo.replay_round(1, [1.0, 1.0, -1.0, 10.0, -10.0, 10.0])
    record = zo.describe()["guard"]
    assert record["action"] == "stopped" and record["step"] == 3 and record["rule"] == "spike"
    assert record["value"] == 10.0 and record["reference"] == 1.0
    assert "its clients' models after step 3, the refused step included" in zo.stop_reason()
    assert make_gossip(tiny, make_topology("ring", 3)).describe()["guard"] == {"action": "off"}
    with pytest.raises(ValueError, match="only zo makes them"):
        make_gossip(tiny, make_topology("ring", 3), guard=guard)


def test_batched_forwards_refuse_full_parameter_gossip(tiny) -> None:
    with pytest.raises(ValueError, match="LoRA adapters"):
        make_gossip(tiny, make_topology("ring", 3), estimator="zo", batched=True)
    model = copy.deepcopy(tiny[0])
    adapters = add_lora(model, rank=4, alpha=8, targets=("q_proj",), seed=0)
    with pytest.raises(ValueError, match="zo estimator"):
        make_gossip(tiny, make_topology("ring", 3), model=model, trainable=adapters, batched=True)


def test_pure_gossip_contracts_at_the_spectral_gap_rate(tiny) -> None:
    """With no local steps, ‖X − 1x̄ᵀ‖² shrinks by (1 − gap)² per round once the slowest mode
    dominates."""
    topology = make_topology("ring", 8)
    model = nn.Linear(50, 40, bias=False)
    gossip = make_gossip(tiny, topology, model=model, trainable=[model.weight], lr=0.0)
    gossip.x.copy_(torch.randn(8, 2000, generator=torch.Generator().manual_seed(0)))
    mean_before = gossip.x.mean(dim=0).clone()
    distances = [gossip.consensus_distance()]
    for _ in range(40):
        gossip.communicate()
        distances.append(gossip.consensus_distance())
    rate = (1 - topology.spectral_gap()) ** 2
    assert distances[-1] / distances[-2] == pytest.approx(rate, rel=0.01)
    assert all(b <= a * rate * 1.0001 for a, b in itertools.pairwise(distances))
    assert torch.allclose(gossip.x.mean(dim=0), mean_before, atol=1e-5)


def test_a_run_that_cannot_fit_is_refused_before_it_starts() -> None:
    config = RunConfig(method="choco", clients=4096, n_train=4096)
    with pytest.raises(ConfigError, match=r"choco with 4096 clients keeps 2 × 4096 × .* GB"):
        check_memory(config, 134_515_008, torch.device("cpu"))
    check_memory(
        RunConfig(method="seedflood", clients=4096, n_train=4096), 134_515_008, torch.device("cpu")
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_full_dzsgd_counts_its_draw_threads_buffers_in_the_cpus_memory_alone(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """Each thread drawing ahead holds a model-sized CPU buffer: a run that fits without them
    is refused with 8 on the CPU, and not on a GPU, whose memory holds none of them."""
    config = RunConfig(method="dzsgd", clients=16)
    without = gossip_memory_bytes(16, 134_515_008, compressed=False, batched=False)
    assert gossip_memory_bytes(16, 134_515_008, False, False, draw_workers=8) == (
        without + 8 * 134_515_008 * 4
    )
    monkeypatch.setattr("seedflood.sim.runner.available_bytes", lambda _: without + 2**20)
    monkeypatch.setenv("SEEDFLOOD_DRAW_THREADS", "0")
    check_memory(config, 134_515_008, torch.device(device))
    monkeypatch.setenv("SEEDFLOOD_DRAW_THREADS", "8")
    if device == "cpu":
        with pytest.raises(ConfigError, match="method dzsgd with 16 clients keeps 16 × "):
            check_memory(config, 134_515_008, torch.device(device))
    else:
        check_memory(config, 134_515_008, torch.device(device))


@pytest.mark.parametrize(
    ("run", "compressed"),
    [
        ("paper-main-sst2/runs/dzsgd_topology-ring_clients-16_seed-0", False),
        ("paper-main-sst2/runs/dsgd_topology-ring_clients-16_seed-0", False),
        ("paper-main-rte/runs/dsgd_topology-ring_clients-16_seed-0", False),
        ("paper-main-sst2/runs/choco_topology-ring_clients-16_seed-0", True),
    ],
)
def test_the_memory_estimate_is_the_measured_peak_within_ten_percent(
    run: str, compressed: bool
) -> None:
    """The guard refuses only what would not fit, so its estimate must be the peak the runs of
    the paper grids measured (full-parameter SmolLM2-135M, 16 clients, on this CPU)."""
    results = json.loads((Path("results") / run / "results.json").read_text())
    measured = results["peak_rss_mb"] * 2**20
    estimate = gossip_memory_bytes(16, results["parameters"], compressed, batched=False)
    assert 0.9 < estimate / measured < 1.1


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ),
    ],
)
def test_the_mixing_operator_multiplies_by_w_sparse_on_the_cpu_dense_on_a_gpu(device: str) -> None:
    """On an H200 torch's sparse product returned zeros for states 10⁶ wide
    (results/bench/gpu-fo/sparse-products-h200.json): a GPU mixes with the dense matrix."""
    matrix = make_topology("ring", 6).mixing_matrix("metropolis")
    operator = mixing_operator(matrix, torch.device(device))
    assert operator.is_sparse == (device == "cpu")
    states = torch.randn(6, 1 << 20, generator=torch.Generator().manual_seed(0))
    expected = torch.from_numpy(matrix).float() @ states
    mixed = (operator @ states.to(device)).cpu()
    assert torch.allclose(mixed, expected, rtol=1e-6, atol=1e-6)
    assert mixed.abs().max() > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a lent one)")
@pytest.mark.parametrize("topk_ratio", [None, 1.0], ids=["dsgd", "choco"])
def test_first_order_gossip_on_a_gpu_takes_the_cpus_steps(tiny, topk_ratio) -> None:
    """DSGD and ChocoSGD end where they end on the CPU, to float rounding: their runs on an H100
    and an H200 fell to a loss of exactly ln 2 where the CPU's trained (tools/gpu_fo_check.py
    checks the full-size case). ChocoSGD sends every entry here: with a cut, rounding could move
    an entry across it and a whole value with it."""
    topology = make_topology("ring", 6)
    states = []
    for device in ("cpu", "cuda"):
        with torch.device(device):
            model = copy.deepcopy(tiny[0]).to(device)
            gossip = make_gossip(
                tiny, topology, model=model, topk_ratio=topk_ratio, gamma=0.5, local_steps=2
            )
            for index in range(3):
                gossip.run_round(index)
        assert gossip.describe()["mixing_operator"] == ("sparse" if device == "cpu" else "dense")
        states.append(gossip.x.cpu())
    initial = torch.cat([p.detach().flatten() for p in tiny[0].parameters()])
    assert not torch.allclose(states[0][0], initial, atol=1e-4)
    assert torch.allclose(states[1], states[0], rtol=1e-4, atol=1e-5)


def test_mixing_a_column_slice_is_the_dense_product_whatever_its_stride() -> None:
    """Mixing takes column chunks of the n × d state, each copied contiguous (see
    ``mixed_chunks``): the chunks together are W times the whole state."""
    topology = make_topology("ring", 5)
    weights = torch.from_numpy(topology.mixing_matrix("metropolis")).float()
    state = torch.randn(5, 3 * CHUNK + 7, generator=torch.Generator().manual_seed(1))
    mixed = torch.empty_like(state)
    for columns, chunk in mixed_chunks(weights.to_sparse(), state):
        mixed[:, columns] = chunk
    assert torch.allclose(mixed, weights @ state, atol=1e-6)
