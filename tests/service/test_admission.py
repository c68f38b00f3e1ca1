"""The node's admission gate: every protocol consults it before any handler runs.

A gate that refuses one peer makes every protocol refuse that peer (the error
reply ``not_admitted``, or the protocol's own refusal with that code), with
the run the request names, while the node keeps serving everyone else.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import AsyncExitStack

import pytest
import torch
import trio

from p2pdl import SERVICES, OpenAdmission, Refusal, open_node
from p2pdl.averaging import (
    ALLREDUCE_PROTOCOL_ID,
    AllReduceConfig,
    CodecPolicy,
    Group,
    GroupMemberInfo,
)
from p2pdl.averaging.matchmaking import MATCHMAKING_PROTOCOL
from p2pdl.averaging.matchmaking._messages import Join
from p2pdl.dht import DHT_PROTOCOL
from p2pdl.dht._messages import FindNode
from p2pdl.errors import RemoteError, StreamClosedError
from p2pdl.membership import MEMBERSHIP_PROTOCOL
from p2pdl.membership._messages import GetRevocations
from p2pdl.nat import DIALBACK, DialBackRequest
from p2pdl.progress import PROGRESS_PROTOCOL
from p2pdl.progress._messages import Push
from p2pdl.service import NOT_ADMITTED, Gatekeeper
from p2pdl.statesync import STATESYNC_PROTOCOL
from p2pdl.statesync._messages import GetManifest
from p2pdl.testing import loopback_config
from p2pdl.wire import PING, PING_PROTOCOL_ID, Message, MessageSet, PingRequest, RpcProtocol

pytestmark = pytest.mark.timeout(120)

RUN = "gated-run"


class Echo(Message, tag="test.echo"):
    text: str


ECHO = RpcProtocol.define("/test/echo/1.0.0", [Echo], [Echo])
RAW = "/test/raw/1.0.0"


class BanGate:
    """Refuses the peers in ``banned``; records what it was asked."""

    def __init__(self) -> None:
        self.banned: set = set()
        self.asked: list[tuple[object, str, str | None]] = []

    def admit(self, peer, protocol_id, run_id):
        self.asked.append((peer, protocol_id, run_id))
        if peer in self.banned:
            return Refusal("banned in this test")
        return None


#: One request per request/response protocol a node serves, and the run it names.
REQUESTS = {
    PING_PROTOCOL_ID: (PING, PingRequest(7), None),
    DIALBACK.protocol_id: (DIALBACK, DialBackRequest([]), None),
    DHT_PROTOCOL.protocol_id: (DHT_PROTOCOL, FindNode(b"\x01" * 32), None),
    # The membership handshake is how one becomes a member: a request of no run.
    MEMBERSHIP_PROTOCOL.protocol_id: (MEMBERSHIP_PROTOCOL, GetRevocations(RUN), None),
    PROGRESS_PROTOCOL.protocol_id: (PROGRESS_PROTOCOL, Push(RUN, ()), RUN),
    MATCHMAKING_PROTOCOL.protocol_id: (MATCHMAKING_PROTOCOL, Join(RUN, 3, 4, False, 1.0), RUN),
    STATESYNC_PROTOCOL.protocol_id: (STATESYNC_PROTOCOL, GetManifest(RUN), RUN),
    ECHO.protocol_id: (ECHO, Echo("hi"), None),
}


def test_the_default_gate_admits_everyone_and_the_gatekeeper_counts():
    keeper = Gatekeeper(OpenAdmission())
    assert keeper.check("peer", "/p", "run") is None
    gate = BanGate()
    gate.banned.add("bad")
    keeper = Gatekeeper(gate)
    assert keeper.check("good", "/a", None) is None
    assert keeper.check("bad", "/a", None) == Refusal("banned in this test", NOT_ADMITTED)
    assert keeper.check("bad", "/b", "run") is not None
    stats = keeper.statistics()
    assert (stats.admitted, stats.refused) == (1, 2)
    assert stats.refused_by_protocol == {"/a": 1, "/b": 1}
    assert NOT_ADMITTED == "not_admitted"


async def test_every_protocol_consults_the_gate_and_the_node_keeps_serving_others(caplog):
    gate = BanGate()
    config = loopback_config()
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(open_node(config, admission=gate))
        honest = await stack.enter_async_context(open_node(config))
        outsider = await stack.enter_async_context(open_node(config))

        async def echo(ctx, request):
            return request

        served = trio.Event()

        async def raw(stream):
            served.set()

        server.serve(ECHO, echo)
        server.set_stream_handler(RAW, raw)
        for node in (honest, outsider):
            await node.connect(server.addrs[0])
        gate.banned.add(outsider.peer_id)

        # Every protocol the node serves is covered here: a new one must be added.
        served_ids = {PING_PROTOCOL_ID, ECHO.protocol_id, RAW}
        for entry in SERVICES:
            served_ids |= {e.protocol_id for e in getattr(server, entry.name).endpoints()}
        assert served_ids == set(REQUESTS) | {ALLREDUCE_PROTOCOL_ID, RAW}

        caplog.set_level(logging.INFO)
        for protocol_id, (protocol, request, run_id) in REQUESTS.items():
            with pytest.raises(RemoteError) as refused:
                await outsider.call(server.peer_id, protocol, request, timeout=10)
            assert refused.value.code == NOT_ADMITTED, protocol_id
            assert (outsider.peer_id, protocol_id, run_id) in gate.asked, protocol_id
            # An honest peer is answered (or refused for its own reasons, never by the gate).
            try:
                await honest.call(server.peer_id, protocol, request, timeout=10)
            except RemoteError as exc:
                assert exc.code != NOT_ADMITTED, protocol_id
            assert (honest.peer_id, protocol_id, run_id) in gate.asked, protocol_id

        # A user's streaming protocol: the refused peer's stream is reset unserved.
        with pytest.raises(StreamClosedError), trio.fail_after(10):
            async with outsider.open_stream(server.peer_id, RAW) as stream:
                await stream.receive_message(MessageSet())
        assert not served.is_set()
        async with honest.open_stream(server.peer_id, RAW):
            with trio.fail_after(10):
                await served.wait()

        stats = server.statistics()
        # (the outsider's own reachability probes were refused too)
        assert stats.admission.refused >= len(REQUESTS) + 1
        assert all(stats["admission"]["refused_by_protocol"][p] >= 1 for p in [*REQUESTS, RAW])
        assert await honest.ping(server.peer_id) > 0
        # Each refused peer is logged once, at INFO, without a traceback.
        refusals = [r for r in caplog.records if "refused" in r.getMessage()
                    and str(outsider.peer_id) in r.getMessage()]
        assert len(refusals) == 1 and refusals[0].levelno == logging.INFO
        assert not any(r.exc_info for r in caplog.records)


async def test_the_all_reduce_refuses_a_sender_the_gate_refuses():
    gate = BanGate()
    config = loopback_config()
    exact = AllReduceConfig(codecs=CodecPolicy(large="none"), chunk_values=1024,
                            sender_timeout=5.0, reducer_timeout=10.0, averaging_timeout=30.0)
    async with AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(open_node(config, admission=gate)),
                 await stack.enter_async_context(open_node(config)),
                 await stack.enter_async_context(open_node(config))]
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                await a.connect(b.addrs[0])
        gated, _, outsider = nodes
        gate.banned.add(outsider.peer_id)
        members = tuple(GroupMemberInfo(n.peer_id) for n in nodes)
        group = Group(hashlib.sha256(b"gated").digest(), RUN, 1, members)
        xs = [[torch.full((3000,), float(i + 1))] for i in range(3)]
        results = {}

        async def one(i):
            results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=exact)

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)

        assert (outsider.peer_id, ALLREDUCE_PROTOCOL_ID, RUN) in gate.asked
        assert gated.allreduce.statistics()["streams_rejected"] >= 1
        # The gated node's own part was averaged without the refused sender ...
        part = results[0].parts[0]
        assert part.completed
        assert all(2 not in c.contributors for c in part.contributions)
        assert torch.allclose(results[0].tensors[0][part.start:part.end], torch.tensor(1.5))
        # ... and the refused sender kept its own values for that part.
        assert not results[2].parts[0].completed
