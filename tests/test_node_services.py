"""A protocol of one's own is one :class:`~p2pdl.ServiceEntry`: the node
builds it, serves its endpoints behind the gate, starts it, names it on
every face and counts it in ``statistics()``."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any

import pytest
import trio

from p2pdl import SERVICES, Node, NodeStatistics, ServiceEntry, TrioNode, open_node
from p2pdl._node import statistics_record
from p2pdl.errors import ConfigError
from p2pdl.service import RpcEndpoint, Statistics, serve_nothing
from p2pdl.wire import MaxLen, Message, RpcProtocol

pytestmark = pytest.mark.timeout(60)


class EchoRequest(Message, tag="echo.request"):
    text: Annotated[str, MaxLen(64)]


class EchoResponse(Message, tag="echo.response"):
    text: Annotated[str, MaxLen(64)]


ECHO = RpcProtocol.define("/p2pdl/echo/1.0.0", [EchoRequest], [EchoResponse])


@dataclasses.dataclass(frozen=True)
class EchoStatistics(Statistics):
    answered: int = 0


class EchoService:
    """Answers every request with its text, reversed."""

    def __init__(self, started: list[str]) -> None:
        self.answered = 0
        self._started = started

    def endpoints(self) -> list[RpcEndpoint]:
        return [RpcEndpoint(ECHO, self._answer)]

    async def _answer(self, ctx: Any, request: EchoRequest) -> EchoResponse:
        self.answered += 1
        return EchoResponse(request.text[::-1])

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._started.append("echo")
        await serve_nothing(task_status)

    def statistics(self) -> EchoStatistics:
        return EchoStatistics(self.answered)


class SyncEcho:
    def __init__(self, portal: Any, echo: EchoService) -> None:
        self._portal, self._echo = portal, echo

    def statistics(self) -> EchoStatistics:
        return self._portal.run_sync(self._echo.statistics)


class AsyncioEcho(SyncEcho):
    async def statistics(self) -> EchoStatistics:   # type: ignore[override]
        return await asyncio.to_thread(self._portal.run_sync, self._echo.statistics)


def echo_entry(started: list[str]) -> ServiceEntry:
    return ServiceEntry("echo", EchoService, lambda ctx, cfg, s: EchoService(started),
                        lambda portal, node, cfg: SyncEcho(portal, node.echo),
                        lambda portal, node, cfg: AsyncioEcho(portal, node.echo),
                        about="reversed text, for a test")


async def test_one_entry_adds_a_protocol_to_a_trio_node():
    started: list[str] = []
    services = (*SERVICES, echo_entry(started))
    async with open_node(listen=["/ip4/127.0.0.1/tcp/0"], services=services) as a, \
            open_node(listen=["/ip4/127.0.0.1/tcp/0"], services=services) as b:
        assert started == ["echo", "echo"]
        assert isinstance(a.echo, EchoService) and a.services[-1].name == "echo"
        await b.connect(f"{a.addrs[0]}/p2p/{a.peer_id}")
        reply = await b.call(a.peer_id, ECHO, EchoRequest("gate"))
        assert reply == EchoResponse("etag")
        stats = a.statistics()
        assert stats.echo == EchoStatistics(1) and stats["echo"]["answered"] == 1
        assert "dht" in stats and "allreduce" in stats
        assert not isinstance(stats, NodeStatistics)   # a record with the echo field
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        TrioNode.__getattr__(a, "nope")


def test_the_default_record_has_a_field_per_service():
    names = [f.name for f in dataclasses.fields(NodeStatistics)]
    assert names[-len(SERVICES):] == [entry.name for entry in SERVICES]
    record = statistics_record((*SERVICES, echo_entry([])))
    assert [f.name for f in dataclasses.fields(record)][-1] == "echo"


def test_one_entry_adds_a_protocol_to_the_sync_and_asyncio_faces():
    with Node(listen=["/ip4/127.0.0.1/tcp/0"], services=(*SERVICES, echo_entry([]))) as node:
        assert node.echo.statistics() == EchoStatistics(0)
        assert asyncio.run(node.aio.echo.statistics()) == EchoStatistics(0)
        assert node.statistics()["echo"]["answered"] == 0
        assert not hasattr(node, "nat")   # no face declared: the node shows reachability


@pytest.mark.parametrize("services", [
    SERVICES[1:],                                     # the node's own left out
    (*SERVICES, echo_entry([]), echo_entry([])),      # a name twice
    (*SERVICES, dataclasses.replace(echo_entry([]), name="peer_id")),   # the node's own name
    (*SERVICES, dataclasses.replace(echo_entry([]), name="paths")),
    (*SERVICES, dataclasses.replace(echo_entry([]), name="not a name")),
])
async def test_a_list_of_services_the_node_cannot_run_is_one_clear_error(services):
    with pytest.raises(ConfigError, match="services must|service names"):
        async with open_node(listen=["/ip4/127.0.0.1/tcp/0"], services=services):
            pass


def test_a_sync_face_may_not_hide_the_nodes_own_attributes():
    with pytest.raises(ConfigError, match="may not be called 'shutdown'"):
        Node(listen=["/ip4/127.0.0.1/tcp/0"],
             services=(*SERVICES, dataclasses.replace(echo_entry([]), name="shutdown")))
