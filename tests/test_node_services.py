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
from p2pdl.errors import CallTimeoutError, ConfigError
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


class AskingEchoService(EchoService):
    """An echo service that declares no faces: the node derives them."""

    def __init__(self, ctx: Any, started: list[str]) -> None:
        super().__init__(started)
        self._ctx = ctx
        self.label = "echo"

    async def ask(self, peer: Any, text: str) -> str:
        """``text`` reversed by ``peer``'s echo service."""
        reply = await self._ctx.call(peer, ECHO, EchoRequest(text), 10.0)
        return reply.text

    async def hang(self) -> None:
        await trio.sleep_forever()

    def reverse(self, text: str) -> str:
        return text[::-1]

    @property
    def asked(self) -> int:
        return self.answered


def asking_entry() -> ServiceEntry:
    return ServiceEntry("echo", AskingEchoService,
                        lambda ctx, cfg, s: AskingEchoService(ctx, []))


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


def test_a_service_that_declares_no_faces_gets_them_derived_from_its_class():
    services = (*SERVICES, asking_entry())
    listen = ["/ip4/127.0.0.1/tcp/0"]
    with Node(listen=listen, services=services) as a, Node(listen=listen, services=services) as b:
        b.connect(f"{a.addrs[0]}/p2p/{a.peer_id}")
        assert b.echo.ask(a.peer_id, "derived") == "devired"      # a coroutine, blocking
        assert b.echo.reverse("abc") == "cba"                       # a plain method
        assert a.echo.asked == 1 and a.echo.label == "echo"         # a property, an attribute
        assert {"ask", "hang", "reverse", "asked", "statistics"} <= set(dir(b.echo))
        assert "serve" not in dir(b.echo) and "endpoints" not in dir(b.echo)
        with pytest.raises(CallTimeoutError, match="AskingEchoService.hang"):
            b.echo.hang(timeout=0.2)
        for name in ("_ctx", "serve", "endpoints", "nope"):
            with pytest.raises(AttributeError):
                getattr(b.echo, name)

        async def from_asyncio() -> tuple[str, str, int]:
            asked = await b.aio.echo.ask(a.peer_id, "loop", timeout=10.0)
            with pytest.raises(CallTimeoutError):
                await b.aio.echo.hang(timeout=0.2)
            return asked, await b.aio.echo.reverse("xy"), await b.aio.echo.asked

        assert asyncio.run(from_asyncio()) == ("pool", "yx", 0)
        assert a.statistics()["echo"]["answered"] == 2
        assert "AskingEchoService" in repr(b.echo) and "AsyncioFace" in repr(b.aio.echo)


def test_an_asyncio_call_cancelled_cancels_the_call_on_the_trio_thread():
    with Node(listen=["/ip4/127.0.0.1/tcp/0"], services=(*SERVICES, asking_entry())) as node:
        async def cancelled() -> None:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(node.aio.echo.hang(timeout=None), 0.2)

        asyncio.run(cancelled())
        assert node.echo.reverse("ok") == "ko"    # the node still serves
