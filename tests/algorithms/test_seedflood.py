"""SeedFlood on the tiny model: consensus, and the shared-state simulator against per-client
copies."""

from __future__ import annotations

import copy

import pytest
import torch

from seedflood.algorithms import seedflood as seedflood_module
from seedflood.algorithms.seedflood import SeedFlood
from seedflood.learning.models import load_model, state_hash
from seedflood.learning.scoring import loss_and_correct, tokenize
from seedflood.learning.tasks import Example, partition
from seedflood.protocol.clipping import ScalarClip
from seedflood.protocol.flooding import FloodState, flood
from seedflood.protocol.messages import Message, quantize
from seedflood.sim.faults import simulated_links
from seedflood.sim.network import SimulatedNetwork
from seedflood.topology import Topology, make_topology
from seedflood.zo import make_direction, message_seed, trainable_matrices, two_point_estimate

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def synthetic_examples(count: int) -> list[Example]:
    """Sentences whose label is whether a positive word occurs: learnable, and no data files."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(count):
        picks = torch.randint(0, len(WORDS), (3,), generator=generator).tolist()
        words = [WORDS[p] for p in picks]
        label = int(picks[0] % 2 == 0)
        examples.append(
            Example(f"The film was {' '.join(words)}. It was", (" terrible", " great"), label)
        )
    return examples


def make_seedflood(
    tiny, topology: Topology, hops: int, direction: str = "subcge", **kw
) -> SeedFlood:
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    shards = partition(synthetic_examples(8 * topology.n), topology.n, seed=0)
    local_steps, scalar_format = kw.get("local_steps", 1), kw.get("scalar_format", "fp32")
    network, repair = simulated_links(
        topology,
        kw.get("faults"),
        scalar_format=scalar_format,
        local_steps=local_steps,
        hops=hops,
    )
    return SeedFlood(
        model=model,
        direction=make_direction(direction, model, rank=8, refresh=3, run_seed=11),
        topology=topology,
        shards=[tokenize(tokenizer, shard, 64) for shard in shards],
        pad_id=tokenizer.pad_token_id,
        lr=kw.get("lr", 1e-2),
        eps=1e-3,
        batch_size=4,
        local_steps=local_steps,
        hops=hops,
        scalar_format=scalar_format,
        run_seed=11,
        batched=kw.get("batched", False),
        network=network,
        repair=repair,
        clip=kw.get("clip"),
    )


def parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class PerClientCopies:
    """The obvious implementation: every client owns a model that is the initial one plus every
    message it holds, applied in canonical order from scratch."""

    def __init__(self, sim: SeedFlood, initial: torch.nn.Module) -> None:
        self.sim = sim
        self.initial = initial
        self.held: list[dict[tuple[int, int], Message]] = [{} for _ in range(sim.n)]
        self.floods = [FloodState(i, sim.topology.neighbors[i]) for i in range(sim.n)]
        self.network = SimulatedNetwork(sim.topology.neighbors, sim.scalar_format)

    def model_of(self, client: int) -> torch.nn.Module:
        model = copy.deepcopy(self.initial)
        direction = make_direction("subcge", model, rank=8, refresh=3, run_seed=11)
        direction.apply(self.sim.updates(sorted(self.held[client].values())))
        return model

    def run_round(self, round_index: int) -> None:
        sim = self.sim
        for offset in range(sim.local_steps):
            step = round_index * sim.local_steps + offset
            for client in range(sim.n):
                model = self.model_of(client)
                direction = make_direction("subcge", model, rank=8, refresh=3, run_seed=11)
                batch = sim.batch(client, step)
                g, _ = two_point_estimate(
                    lambda m=model, b=batch: loss_and_correct(m, b, sim.pad_id)[0],
                    direction.touch(message_seed(11, client, step), step),
                    sim.eps(step),
                )
                message = Message(step, client, quantize(g, sim.scalar_format))
                self.floods[client].originate(message)
                self.held[client][message.key] = message
        for client, received in enumerate(flood(self.floods, self.network, sim.hops)):
            for message in received:
                self.held[client][message.key] = message


@pytest.mark.slow  # three topologies, every client kept apart (about 15 s)
@pytest.mark.parametrize("name", ["ring", "meshgrid", "random_regular"])
def test_hops_equal_to_diameter_keep_every_client_bit_identical(tiny, name: str) -> None:
    topology = make_topology(name, 10, seed=3)
    sim = make_seedflood(tiny, topology, hops=topology.diameter)
    reference = PerClientCopies(sim, copy.deepcopy(sim.model))
    initial = parameters(sim.model)
    for round_index in range(3):
        sim.run_round(round_index)
        reference.run_round(round_index)
        assert sim.clients_identical() and sim.consensus_distance() == 0.0
        assert sim.committed_step == round_index
        base = parameters(sim.model)
        for client in range(sim.n):
            assert same(parameters(reference.model_of(client)), base)
    assert not same(initial, parameters(sim.model))


@pytest.mark.slow
def test_full_flooding_trains_the_same_model_on_every_topology(tiny) -> None:
    """With hops = diameter every client applies every message within its round, so the graph
    changes what the edges carry and never the weights: SeedFlood's ring and meshgrid cells of
    the main table must agree bit for bit (their runs' state hashes are equal)."""
    final = {}
    for name in ("ring", "meshgrid", "random_regular"):
        topology = make_topology(name, 10, seed=3)
        sim = make_seedflood(tiny, topology, hops=topology.diameter)
        for round_index in range(3):
            sim.run_round(round_index)
        final[name] = parameters(sim.model)
    assert same(final["ring"], final["meshgrid"])
    assert same(final["ring"], final["random_regular"])
    assert not same(final["ring"], parameters(tiny[0]))


@pytest.mark.slow
def test_delayed_flooding_matches_per_client_copies_bit_for_bit(tiny) -> None:
    topology = make_topology("ring", 8)
    sim = make_seedflood(tiny, topology, hops=1, local_steps=2)
    reference = PerClientCopies(sim, copy.deepcopy(sim.model))
    distances = []
    for round_index in range(5):
        sim.run_round(round_index)
        reference.run_round(round_index)
        for client in range(sim.n):
            with sim.client_view(client):
                assert same(parameters(sim.model), parameters(reference.model_of(client)))
        distances.append(sim.consensus_distance())
    assert not sim.clients_identical()
    assert all(d > 0 for d in distances)
    # a round's messages reach distance h within ⌈h/k⌉ rounds, counting their own: after 5 rounds
    # on a ring of diameter 4 the first 2 rounds (4 steps) are everywhere and committed
    assert sim.committed_step == 2 * (5 - 4 + 1) - 1


@pytest.mark.slow
def test_global_view_is_the_mean_of_client_models(tiny) -> None:
    sim = make_seedflood(tiny, make_topology("ring", 6), hops=1)
    for round_index in range(2):
        sim.run_round(round_index)
    views = []
    for client in range(sim.n):
        with sim.client_view(client):
            views.append(parameters(sim.model))
    with sim.global_view():
        mean_model = parameters(sim.model)
    for index, tensor in enumerate(mean_model):
        expected = torch.stack([v[index] for v in views]).double().mean(dim=0)
        assert torch.allclose(tensor.double(), expected, atol=1e-6)
    spread = (
        sum(
            float(
                (
                    (
                        torch.cat([v.flatten() for v in view]).double()
                        - torch.cat([t.flatten() for t in mean_model]).double()
                    )
                    ** 2
                ).sum()
            )
            for view in views
        )
        / sim.n
    )
    assert sim.consensus_distance() == pytest.approx(spread, rel=1e-3)


@pytest.mark.slow
def test_every_client_applies_the_scalar_the_codec_carries(tiny) -> None:
    """A bf16 run equals per-client copies that only ever see decoded packets."""
    topology = make_topology("ring", 4)
    sim = make_seedflood(tiny, topology, hops=1, scalar_format="bf16")
    reference = PerClientCopies(sim, copy.deepcopy(sim.model))
    for round_index in range(3):
        sim.run_round(round_index)
        reference.run_round(round_index)
    for client in range(sim.n):
        held = sim.held_messages(client)
        assert held and all(quantize(m.scalar, "bf16") == m.scalar for m in held)
        with sim.client_view(client):
            assert same(parameters(sim.model), parameters(reference.model_of(client)))


def test_batched_forwards_give_the_one_by_one_estimates(tiny) -> None:
    """With pending messages (hops = 1) every client's view differs; one batched forward over the
    shared base must give each client's losses as its own model would."""
    topology = make_topology("ring", 6)
    sim = make_seedflood(tiny, topology, hops=1)
    for round_index in range(3):
        sim.run_round(round_index)
    assert not sim.clients_identical()
    batched = sim._estimates_batched(3)
    one_by_one = sim._estimates_one_by_one(3)
    for (g_batched, loss_batched), (g_single, loss_single) in zip(batched, one_by_one, strict=True):
        assert loss_batched == pytest.approx(loss_single, rel=1e-6)
        assert g_batched == pytest.approx(g_single, rel=1e-3, abs=1e-4)


NEEDS_CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: batched forwards computed there"
)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])
@pytest.mark.parametrize("hops", [1, 3])
@pytest.mark.slow
def test_batched_estimates_on_a_device_match_one_by_one_and_repeat_bit_for_bit(
    tiny, device: str, hops: int
) -> None:
    """On each device the batched forwards (the general path with pending messages at hops = 1,
    the one-update-per-row path at hops = diameter) give each client's own estimate, and a run
    repeated there ends on the same hash: peers on one kind of device round alike."""
    model, ring = copy.deepcopy(tiny[0]).to(device), make_topology("ring", 6)
    hashes = []
    for _ in range(2):
        sim = make_seedflood((model, tiny[1]), ring, hops=hops, batched=True)
        with torch.device(device):  # as the runner computes rounds
            for round_index in range(3):
                sim.run_round(round_index)
            batched = sim._estimates_batched(3)
            one_by_one = sim._estimates_one_by_one(3)
        hashes.append(sim.state_hash())
        for (g_batched, loss), (g_single, loss_single) in zip(batched, one_by_one, strict=True):
            assert loss == pytest.approx(loss_single, rel=1e-5)
            assert g_batched == pytest.approx(g_single, rel=1e-2, abs=1e-3)
    assert hashes[0] == hashes[1] != state_hash(trainable_matrices(tiny[0]))


@pytest.mark.slow  # batched and per-client runs side by side (about 10 s)
def test_batched_groups_walk_the_shared_weights_and_restore_them(tiny, monkeypatch) -> None:
    """With a small correction budget clients split into many groups; the shared weights walk
    between them, every estimate still matches the exact one-by-one path and the base comes back
    bit for bit."""
    monkeypatch.setattr(seedflood_module, "MAX_CORRECTIONS", 16)
    topology = make_topology("ring", 12)
    sim = make_seedflood(tiny, topology, hops=1)
    for round_index in range(5):
        sim.run_round(round_index)
    helds = [sim.held(client) for client in range(sim.n)]
    groups = sim._groups(helds)
    assert 1 < len(groups) < sim.n
    assert [c for group in groups for c in group] == list(range(sim.n))
    base = parameters(sim.model)
    batched = sim._estimates_batched(5)
    assert same(parameters(sim.model), base)
    one_by_one = sim._estimates_one_by_one(5)
    for (g_batched, loss_batched), (g_single, loss_single) in zip(batched, one_by_one, strict=True):
        assert loss_batched == pytest.approx(loss_single, rel=1e-6)
        assert g_batched == pytest.approx(g_single, rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("hops", [1, 3])
def test_a_batched_round_names_the_device_of_every_tensor_it_makes(tiny, hops: int) -> None:
    """Under a GPU's default device a tensor built from Python values is a copy from pageable
    memory, which waits for every kernel queued before it; a round's forwards must make none
    (they build on the CPU and move in pinned copies). Under a `meta` default device any such
    tensor has no values, so the round fails or trains something else."""
    expected = make_seedflood(tiny, make_topology("ring", 6), hops=hops, batched=True)
    checked = make_seedflood(tiny, make_topology("ring", 6), hops=hops, batched=True)
    for round_index in range(4):
        expected.run_round(round_index)
        with torch.device("meta"):
            checked.run_round(round_index)
    assert checked.state_hash() == expected.state_hash() != state_hash(trainable_matrices(tiny[0]))


def test_batched_runs_keep_exact_consensus(tiny) -> None:
    topology = make_topology("meshgrid", 9)
    sim = make_seedflood(tiny, topology, hops=topology.diameter, batched=True)
    before = parameters(sim.model)
    for round_index in range(2):
        sim.run_round(round_index)
        assert sim.clients_identical() and sim.consensus_distance() == 0.0
    assert not same(before, parameters(sim.model))


def test_walks_are_the_updates_of_the_difference_bit_for_bit(tiny) -> None:
    """Batched forwards walk the shared weights by arrays gathered from the pending coordinates
    (seedflood.algorithms.pending): each walk must be the list `_difference` builds, clipped
    alike, in its order, across subspace epochs, so that it rounds as that list does."""
    topology = make_topology("ring", 8)
    sim = make_seedflood(tiny, topology, hops=1, batched=True, clip=ScalarClip(0.5, 4))
    for round_index in range(5):
        sim.run_round(round_index)
    helds = [sim.held(client) for client in range(sim.n)]
    walker = sim.walks.walker(sim.pending, sim.clip, sim.lr)
    for source, target in [({}, helds[0]), (helds[0], helds[3]), (helds[5], helds[1])]:
        walked = walker.walk(source, target)
        listed = sim.direction.terms(sim._difference(source, target))
        assert len(walked) and len(walked.epochs.unique()) > 1
        for field in ("rows", "cols", "signs", "coefs", "epochs"):
            assert torch.equal(getattr(walked, field), getattr(listed, field)), field
    messages = [list(made.values()) for made in sim.pending.values()]
    assert any(abs(m.scalar) > sim.clip.bound(made) for made in messages for m in made)  # clipped
