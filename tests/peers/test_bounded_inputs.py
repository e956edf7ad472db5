"""A peer's inputs are hostile until checked (issue 33), in one process: an oversized frame is
refused from its length alone, a non-member's or a banned peer's frame is never parsed, a batch
beyond the step window is refused and never held, stored or forwarded (so digests stay within the
codec's limits, a restart included), repair answers members only and at most a window's worth,
undecodable input is counted and its sender banned, and signatures are checked outside the node's
lock, stopping at a frame's first offence."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

pytest.importorskip("hivemind.p2p", reason="the link's reader is hivemind's stream framing")

from seedflood.config import load_config
from seedflood.learning.models import load_model
from seedflood.peers import batch_exchange
from seedflood.peers.batch_exchange import Exchange
from seedflood.peers.crypto import Context, SignedBatch, join_proof, public_hex
from seedflood.peers.inbox import (
    BatchStore,
    Door,
    batch_body,
    batch_header,
    batch_limit,
    frame_cap,
    window_end,
    window_rounds,
)
from seedflood.peers.p2p import (
    FLOOD_PROTOCOL,
    JOIN_PROTOCOL,
    SYNC_PROTOCOL,
    Frame,
    Link,
    OpenGate,
)
from seedflood.peers.removals import Removal
from seedflood.peers.roster import Members
from seedflood.peers.state import PeerState
from seedflood.protocol.antientropy import MAX_GAP_BYTES, decode_digest
from seedflood.protocol.messages import Message
from seedflood.zo import make_direction
from tests.peers.test_state import quorum_of

PEERS = ["peer-0", "peer-1", "peer-2"]
RUN = Context.of("run", PEERS)


class FakeLink:
    """Records pushes; answers requests with a canned reply."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, bytes]] = []
        self.reply: bytes | None = None

    def push(self, messages_for: dict[str, bytes]) -> set[str]:
        self.pushed += list(messages_for.items())
        return set(messages_for)

    def request(self, peer: str, protocol: str, data: bytes) -> bytes | None:
        return self.reply


class Wiring:
    def __init__(self) -> None:
        self.neighbors = {1: "peer-1", 2: "peer-2"}

    def rewire(self) -> None:
        pass


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


@pytest.fixture
def keys() -> list[Ed25519PrivateKey]:
    return [Ed25519PrivateKey.generate() for _ in PEERS]


def exchange_of(
    tiny, keys, root: Path, cond: threading.Condition | None = None, me: int = 0
) -> Exchange:
    """Client ``me`` of a 3-client run, one step per round, staleness 0, on a fake network."""
    model = tiny[0]
    state = PeerState(
        me=me,
        members=Members.initial(PEERS, [public_hex(k) for k in keys]),
        model=model,
        direction=make_direction("subcge", model, rank=8, refresh=3, run_seed=11),
        shard=[],
        pad_id=0,
        state_dir=root / "state",
        clients=3,
        lr=1e-2,
        eps=1e-3,
        batch_size=4,
        local_steps=1,
        staleness=0,
        scalar_format="fp32",
        run_seed=11,
    )
    cond, door = cond or threading.Condition(), Door(RUN, 1)
    return Exchange(
        config=load_config(None, ["scalar_format=fp32", "clients=3"]),
        cond=cond,
        link=FakeLink(),  # type: ignore[arg-type]
        wiring=Wiring(),
        state=state,
        door=door,
        store=BatchStore(root / "state" / "batches.jsonl"),
        context=RUN,
        signing_key=keys[me],
        quorum=quorum_of(cond, state, door, RUN, keys[me]),
    )


def signed(key: Ed25519PrivateKey, origin: int, step: int, scalar: float = 0.5) -> SignedBatch:
    return SignedBatch(origin, step, (Message(step, origin, scalar),)).sign(key, RUN)


def frame_of(batches: list[SignedBatch]) -> Frame:
    return Frame(batch_header(RUN, batches), batch_body(batches, "fp32"))


class Writer:
    """A stream's writing end that keeps what was written."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.data += bytes(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def serve(link: Link, protocol: str, caller: str, wire: bytes) -> tuple[Writer, bytes]:
    """Serve one stream from ``caller`` carrying ``wire``; what was written back and what of
    ``wire`` the link left unread."""
    from hivemind.p2p import P2P

    link.p2p = SimpleNamespace(send_raw_data=P2P.send_raw_data)

    async def run() -> tuple[Writer, bytes]:
        reader, writer = asyncio.StreamReader(), Writer()
        reader.feed_data(wire)
        reader.feed_eof()
        info = SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: caller))
        await link._serve(protocol)(info, reader, writer)
        return writer, await reader.read()

    return asyncio.run(run())


def wired(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def link_of(handlers: dict[str, Any]) -> Link:
    return Link(None, None, handlers, timeout=1.0)  # type: ignore[arg-type]


# -- sizes ----------------------------------------------------------------------------------------


def test_the_window_and_caps_follow_the_run() -> None:
    assert [window_rounds(s) for s in (0, 1, 3)] == [3, 5, 9]
    # from the committed step, or from a joiner's first step while it replays the log
    assert window_end(9, 0, 2, 0) == 5 + 3 and window_end(-1, 40, 2, 1) == 20 + 5
    assert batch_limit(16, 0) == (16 + 64) * 4 + 256
    assert frame_cap(16, 0, 1) == 64 * 1024 + 80 * 512 + 576 * (4096 + 16)
    assert frame_cap(16, 0, 1) < 3 << 20  # the 4 MiB frame of the measurements is over it


def test_an_oversized_length_is_refused_without_reading_the_body(tiny, keys, tmp_path) -> None:
    calls: list[bytes] = []
    link = link_of({FLOOD_PROTOCOL: lambda caller, data: calls.append(data)})
    claim = (300 << 20).to_bytes(8, "big") + b"abc"
    tracemalloc.start()
    writer, unread = serve(link, FLOOD_PROTOCOL, "peer-1", claim)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert unread == b"abc" and calls == [] and writer.closed and not writer.data
    assert peak < 1 << 20, peak  # nothing near the 300 MiB it claimed
    assert isinstance(link.gate, OpenGate) and link.gate.counts == {"oversized": 1}
    # a member's exchange caps flood frames at what the run's members can send, and bans
    exchange = exchange_of(tiny, keys, tmp_path)
    link.gate = exchange
    cap = exchange.cap(FLOOD_PROTOCOL, reply=False)
    _, unread = serve(link, FLOOD_PROTOCOL, "peer-1", (cap + 1).to_bytes(8, "big") + b"x" * 9)
    assert unread == b"x" * 9 and calls == []
    assert exchange.door.rejected["oversized"] == 1 and list(exchange.door.banned) == ["peer-1"]
    # the same check guards replies this peer reads
    assert asyncio.run(receive(link, (cap + 1).to_bytes(8, "big") + b"y")) is None
    assert exchange.door.rejected["oversized"] == 2 and "peer-2" in exchange.door.banned


async def receive(link: Link, wire: bytes) -> bytes | None:
    """A sync reply from peer-2, as the link reads one."""
    reader = asyncio.StreamReader()
    reader.feed_data(wire)
    reader.feed_eof()
    return await link.receive(reader, "peer-2", SYNC_PROTOCOL, reply=True)


# -- callers --------------------------------------------------------------------------------------


def test_frames_of_non_members_and_banned_peers_are_never_parsed(
    tiny, keys, tmp_path, monkeypatch
) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    parsed: list[str] = []
    monkeypatch.setattr(Frame, "decode", classmethod(lambda cls, data: parsed.append("frame")))
    monkeypatch.setattr(batch_exchange, "read_batches", lambda *a: parsed.append("batches"))
    link = link_of({FLOOD_PROTOCOL: exchange.on_flood, SYNC_PROTOCOL: exchange.on_sync})
    link.gate = exchange
    frame = wired(frame_of([signed(keys[1], 1, 0)]).encode())
    for protocol in (FLOOD_PROTOCOL, SYNC_PROTOCOL):
        writer, unread = serve(link, protocol, "stranger", frame)
        assert unread == frame and not writer.data  # not even the length was read
    exchange.door.ban("peer-2", "a test")
    serve(link, FLOOD_PROTOCOL, "peer-2", frame)
    assert parsed == []
    assert exchange.door.rejected["not_member_caller"] == 2
    assert exchange.door.rejected["banned_caller"] == 1
    assert "stranger" not in exchange.door.banned  # a joiner may pull before its admission is here
    assert exchange.state.pending == {}
    # a member declared gone is no longer heard either; a join is open to non-members
    exchange.state.depart(1, 0)
    assert exchange.refusal("peer-1", FLOOD_PROTOCOL) == "not_member_caller"
    assert exchange.refusal("stranger", JOIN_PROTOCOL) is None
    assert exchange.refusal("peer-2", JOIN_PROTOCOL) == "banned_caller"


def test_a_join_request_for_another_peer_id_is_undecodable(tiny, keys, tmp_path) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    link = link_of({JOIN_PROTOCOL: exchange.on_join})
    link.gate = exchange
    proof = join_proof(keys[1], RUN.run_id, "peer-1")
    request = Frame(
        {"peer": "peer-1", "key": public_hex(keys[1]), "proof": proof, "config": None}
    ).encode()
    writer, _ = serve(link, JOIN_PROTOCOL, "stranger", wired(request))
    assert not writer.data and exchange.door.rejected["undecodable"] == 1
    assert list(exchange.door.banned) == ["stranger"]


# -- the step window ------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [600_000, 10**12])
def test_a_batch_beyond_the_window_is_refused_and_never_held(tiny, keys, tmp_path, step) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    far = signed(keys[1], 1, step)
    assert exchange.take("peer-1", frame_of([far])) == 0
    assert exchange.door.rejected["beyond_window"] == 1 and not exchange.door.banned
    assert exchange.door.batches == {} and exchange.state.pending == {}
    assert exchange.link.pushed == [] and exchange.store.load() == []
    # the last round inside the window is taken; the digest and a repair still work
    edge = signed(keys[1], 1, exchange.window_end())
    assert exchange.take("peer-1", frame_of([edge, far])) == 1
    assert exchange.door.rejected["beyond_window"] == 2 and len(exchange.link.pushed) == 1
    request = Frame.decode(exchange._pull_request())
    assert request.header == {"since": 0, "until": 3}
    assert decode_digest(request.body).holds(3, 1) and not decode_digest(request.body).holds(0, 1)
    reply = Frame.decode(exchange.on_sync("peer-2", exchange._pull_request()))
    assert reply.header["sigs"] == [] and reply.header["removals"] == []


def test_a_digest_stays_within_the_codec_whatever_is_pending(tiny, keys, tmp_path) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    # as an older version left it: a held message 600,000 steps ahead of the committed prefix
    exchange.state.pending[600_000] = {1: Message(600_000, 1, 0.5)}
    exchange.state.pending[5] = {2: Message(5, 2, 0.5)}
    digest = decode_digest(Frame.decode(exchange._pull_request()).body)
    assert digest.holds(5, 2) and not digest.holds(600_000, 1)  # understated, never refused
    assert max(g.bit_length() for g in digest.gaps) <= 8 * MAX_GAP_BYTES


def test_a_restart_leaves_out_stored_batches_beyond_the_window(tiny, keys, tmp_path) -> None:
    store = BatchStore(tmp_path / "state" / "batches.jsonl")
    store.add([signed(keys[1], 1, 0), signed(keys[2], 2, 600_000), signed(keys[1], 1, 10**12)])
    exchange = exchange_of(tiny, keys, tmp_path)
    exchange.restore()
    assert sorted(exchange.door.batches) == [(1, 0)] and list(exchange.state.pending) == [0]
    assert exchange.door.rejected["beyond_window"] == 2
    assert decode_digest(Frame.decode(exchange._pull_request()).body).holds(0, 1)


# -- repair ---------------------------------------------------------------------------------------


def test_a_sync_request_from_a_non_member_gets_no_reply(tiny, keys, tmp_path) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    exchange.take("peer-1", frame_of([signed(keys[1], 1, 0)]))
    link = link_of({SYNC_PROTOCOL: exchange.on_sync})
    link.gate = exchange
    request = wired(Frame({"since": 0}).encode())  # 23 bytes, with its length
    writer, _ = serve(link, SYNC_PROTOCOL, "stranger", request)
    assert writer.data == b"" and exchange.door.rejected["not_member_caller"] == 1
    writer, _ = serve(link, SYNC_PROTOCOL, "peer-2", request)
    reply = Frame.decode(bytes(writer.data[8:]))
    assert [sig[:2] for sig in reply.header["sigs"]] == [[1, 0]]
    assert link.counters.sent[SYNC_PROTOCOL] == len(writer.data) - 8


def test_a_removed_member_that_pulls_gets_the_steps_before_its_removal_and_the_removal(
    tiny, keys, tmp_path
) -> None:
    # a restarted peer the others removed while it was down must learn why nobody waits for it
    exchange = exchange_of(tiny, keys, tmp_path / "member")
    held = [signed(keys[1], 1, 0), signed(keys[2], 2, 0), signed(keys[1], 1, 1)]
    exchange.take("peer-1", frame_of(held))
    removal = Removal(2, 1).signed(keys[0], RUN, by=0).signed(keys[1], RUN, by=1)
    with exchange.cond:
        assert exchange.quorum.take([removal]) == [removal]
    link = link_of({SYNC_PROTOCOL: exchange.on_sync, FLOOD_PROTOCOL: exchange.on_flood})
    link.gate = exchange
    request = wired(Frame({"since": 0}).encode())
    writer, _ = serve(link, SYNC_PROTOCOL, "peer-2", request)
    reply = Frame.decode(bytes(writer.data[8:]))
    assert [sig[:2] for sig in reply.header["sigs"]] == [[1, 0], [2, 0]]  # not step 1's
    assert reply.header["removals"] == [removal.to_wire()]
    # a member still gets step 1; the removed one's pushes are refused unread, and a
    # stranger's pull gets nothing
    member = Frame.decode(bytes(serve(link, SYNC_PROTOCOL, "peer-1", request)[0].data[8:]))
    assert [sig[:2] for sig in member.header["sigs"]] == [[1, 0], [2, 0], [1, 1]]
    flood = wired(frame_of([signed(keys[2], 2, 1)]).encode())
    assert serve(link, FLOOD_PROTOCOL, "peer-2", flood)[0].data == b""
    assert serve(link, SYNC_PROTOCOL, "stranger", request)[0].data == b""
    assert exchange.door.rejected["not_member_caller"] == 2
    # the removed peer takes the steps before its removal, and the removal as its own, which
    # leaves its own seat and state alone (it stops; it does not depart from itself)
    removed = exchange_of(tiny, keys, tmp_path / "removed", me=2)
    removed.link.reply = bytes(writer.data[8:])
    assert removed.pull(["peer-0"]) == 2
    assert removed.quorum.removal_of_me() == removal
    assert removed.state.members.seats[2].gone_from is None and not removed.state.divergences


def test_a_sync_reply_is_capped_at_the_window_and_the_frame_cap(
    tiny, keys, tmp_path, monkeypatch
) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    held = [signed(keys[o], o, r) for r in range(400) for o in (1, 2)]
    exchange.door.batches.update({(b.origin, b.round): b for b in held})
    limit = batch_limit(3, 0)
    assert limit == (3 + 64) * 4 + 256 == 524 < len(held)
    # a pull that names no window gets at most a window's worth of batches, the earliest
    reply = Frame.decode(exchange.on_sync("peer-1", Frame({"since": 0}).encode()))
    assert len(reply.header["sigs"]) == limit and reply.header["sigs"][-1][:2] == [2, 261]
    # an honest pull names its window and gets just that
    reply = Frame.decode(exchange.on_sync("peer-1", Frame({"since": 10, "until": 13}).encode()))
    assert [s[:2] for s in reply.header["sigs"]] == [[o, r] for r in range(10, 14) for o in (1, 2)]
    # and no reply outgrows the cap the puller applies: batches are halved until it fits
    monkeypatch.setattr(Exchange, "cap", lambda self, protocol, reply: 20_000)
    data = exchange.on_sync("peer-1", Frame({"since": 0}).encode())
    assert len(data) <= 20_000 and 0 < len(Frame.decode(data).header["sigs"]) < limit // 2


# -- undecodable input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        b"\x05\x00",  # shorter than a frame
        Frame({"run": ["run", RUN.genesis], "sigs": []}, b"\x99junk").encode(),  # bad packet
        Frame({"removals": [["x", 1, []]]}).encode(),  # a removal that is not one
    ],
)
def test_an_undecodable_flood_frame_is_counted_and_its_sender_banned(
    tiny, keys, tmp_path, wire
) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    link = link_of({FLOOD_PROTOCOL: exchange.on_flood})
    link.gate = exchange
    serve(link, FLOOD_PROTOCOL, "peer-1", wired(wire))
    assert exchange.door.rejected["undecodable"] == 1 and list(exchange.door.banned) == ["peer-1"]


def test_a_signed_nonsense_control_or_a_bad_digest_is_undecodable(tiny, keys, tmp_path) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    bad = SignedBatch(1, 0, (Message(0, 1, 0.5),), {(0, 1): [{"kind": "admit", "index": 3}]})
    assert exchange.take("peer-1", frame_of([bad.sign(keys[1], RUN)])) == 0
    link = link_of({SYNC_PROTOCOL: exchange.on_sync})
    link.gate = exchange
    writer, _ = serve(link, SYNC_PROTOCOL, "peer-2", wired(Frame({"since": 0}, b"\x07").encode()))
    assert not writer.data
    assert exchange.door.rejected["undecodable"] == 2
    assert sorted(exchange.door.banned) == ["peer-1", "peer-2"] and exchange.state.pending == {}


def test_an_undecodable_pull_reply_gets_its_sender_banned(tiny, keys, tmp_path) -> None:
    exchange = exchange_of(tiny, keys, tmp_path)
    exchange.link.reply = Frame({"removals": [[1, 0, [[0, 7]]]]}).encode()
    assert exchange.pull(["peer-1"]) == 0
    exchange.link.reply = Frame({"removals": []}, b"\x01").encode()
    assert exchange.pull(["peer-2"]) == 0
    assert exchange.door.rejected["undecodable"] == 2
    assert sorted(exchange.door.banned) == ["peer-1", "peer-2"]


# -- checking and the lock ------------------------------------------------------------------------


def test_signatures_are_checked_outside_the_lock_and_stop_at_the_first_offence(
    tiny, keys, tmp_path, monkeypatch
) -> None:
    cond = threading.Condition(threading.Lock())
    exchange = exchange_of(tiny, keys, tmp_path, cond)
    checks: list[int] = []
    verifies = SignedBatch.verifies

    def counted(batch: SignedBatch, public: Any, context: Context) -> bool:
        checks.append(batch.round)
        return verifies(batch, public, context)

    monkeypatch.setattr(SignedBatch, "verifies", counted)
    frame = frame_of([signed(keys[1], 1, 0), signed(keys[2], 2, 1)])
    with cond:  # another thread holds the node's lock: both signatures are checked meanwhile
        taking = threading.Thread(target=exchange.take, args=("peer-1", frame))
        taking.start()
        for _ in range(200):
            if len(checks) == 2:
                break
            taking.join(0.01)
        assert checks == [0, 1] and taking.is_alive()  # only recording the verdicts waits
    taking.join(5)
    assert sorted(exchange.state.pending) == [0, 1] and len(exchange.link.pushed) == 1
    # a frame whose first batch is forged: its sender is banned and nothing after is checked
    checks.clear()
    forged = signed(keys[2], 1, 2)  # client 1's batch under client 2's key
    later = [signed(keys[1], 1, 3), signed(keys[2], 2, 3)]
    assert exchange.take("peer-2", frame_of([forged, *later])) == 0
    assert checks == [2] and exchange.door.rejected["forged"] == 1
    assert list(exchange.door.banned) == ["peer-2"] and 3 not in exchange.state.pending
