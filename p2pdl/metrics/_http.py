"""``/metrics`` over HTTP/1.1: h11 on trio, in the node's nursery.

:func:`serve_http` is a small bounded server of ``GET`` and ``HEAD``: one
listener; each connection is served while a slot of ``max_connections`` is
free (else it is answered 503 and closed), each request read within
``request_timeout`` and at most ``max_request_bytes`` long (431 beyond),
any other method 405; what to answer for a path is its caller's
(:data:`Answer`).  Nothing a client sends reaches the node beyond the
request's method and path.  :func:`serve_metrics` serves on it ``GET`` or
``HEAD /metrics``: the Prometheus text exposition of the node's statistics
(:mod:`._families`) and the process's (any other path is 404).
"""

from __future__ import annotations

import http
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..errors import ConfigError
from ._families import node_registry
from .config import MetricsConfig

if TYPE_CHECKING:
    from .. import Node, TrioNode

__all__ = ["serve_metrics", "start_metrics", "serve_http", "metrics_answer", "parse_address",
           "Answer", "METRICS_PATH"]

logger = logging.getLogger(__name__)

#: The path Prometheus scrapes.
METRICS_PATH = "/metrics"
#: Bytes read from a connection at a time.
READ_SIZE = 4096
#: Closing a connection waits at most this long for the client to finish (s).
CLOSE_LINGER = 1.0
#: ... and reads and drops at most this many bytes meanwhile.
CLOSE_DRAIN_BYTES = 1 << 16

#: What a server answers to a ``GET`` (or ``HEAD``) of a path (the request
#: target without its query): status, headers (a ``content-type`` among
#: them, else plain text), body.
Answer = Callable[[str], tuple[int, list[tuple[str, str]], bytes]]


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); ConfigError otherwise."""
    host, sep, port_text = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"address {address!r}: expected HOST:PORT "
                          f"(e.g. 127.0.0.1:9100, or port 0 for a free one)")
    return host, int(port_text)


async def serve_metrics(node: TrioNode, address: str, *, config: MetricsConfig | None = None,
                        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """Serve ``node``'s metrics at ``address`` (``HOST:PORT``) until cancelled.

    Start it with ``await nursery.start(serve_metrics, node, address)``: that
    returns the (host, port) bound (port 0 takes a free one).  Raises
    ConfigError for a bad address or one that cannot be bound (in use).
    """
    await serve_http(address, metrics_answer(node_registry(node)), config=config,
                     what="metrics", task_status=task_status)


def metrics_answer(registry: CollectorRegistry) -> Answer:
    """The answer of a metrics server: ``/metrics``, the registry's exposition."""
    def answer(path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        if path != METRICS_PATH:
            return 404, [], f"not found; the metrics are at {METRICS_PATH}\n".encode()
        return 200, [("content-type", CONTENT_TYPE_LATEST)], generate_latest(registry)
    return answer


async def serve_http(address: str, answer: Answer, *, config: MetricsConfig | None = None,
                     what: str = "metrics",
                     task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Serve ``answer`` at ``address`` (``HOST:PORT``) until cancelled, within
    ``config``'s bounds; ``what`` names the server in logs and errors.  Start
    it with ``nursery.start``: that returns the (host, port) bound.  Raises
    ConfigError for a bad address or one that cannot be bound."""
    config = config or MetricsConfig()
    host, port = parse_address(address)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ConfigError(f"{what} address {address}: {exc.strerror or exc}") from None
    bound = listeners[0].socket.getsockname()
    limiter = trio.CapacityLimiter(config.max_connections)
    logger.info("serving %s at http://%s:%d", what, bound[0], bound[1])
    task_status.started((bound[0], bound[1]))

    async def connection(stream: trio.SocketStream) -> None:
        try:
            limiter.acquire_nowait()
        except trio.WouldBlock:
            await _refuse_busy(stream, what)
            return
        try:
            await _serve(stream, answer, config)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass   # the client went away
        finally:
            limiter.release()
            await _close(stream)

    await trio.serve_listeners(connection, listeners)


def start_metrics(node: Node, address: str, *, config: MetricsConfig | None = None,
                  timeout: float = 10.0) -> tuple[str, int]:
    """:func:`serve_metrics` for a sync :class:`~p2pdl.Node`: started in the
    node's nursery (it stops with the node); returns the (host, port) bound."""
    trio_node = node.trio_node

    async def start() -> tuple[str, int]:
        bound: tuple[str, int] = await trio_node.nursery.start(
            lambda task_status: serve_metrics(trio_node, address, config=config,
                                              task_status=task_status))
        return bound

    return node.portal.run(start, timeout)


async def _serve(stream: trio.SocketStream, answer: Answer, config: MetricsConfig) -> None:
    """Answer a connection's requests until it closes, breaks the protocol, is
    too slow, or used its ``max_requests_per_connection``."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=config.max_request_bytes)
    for _ in range(config.max_requests_per_connection):
        try:
            with trio.move_on_after(config.request_timeout) as waited:
                request = await _read_request(stream, connection, config)
        except h11.RemoteProtocolError as exc:   # malformed, or too large
            with trio.move_on_after(config.request_timeout):
                await stream.send_all(_raw_response(exc.error_status_hint, f"{exc}\n"))
            return
        if waited.cancelled_caught or request is None:
            return
        status, headers, body = _answer(request, answer)
        with trio.move_on_after(config.request_timeout) as wrote:
            await _write(stream, connection, status, headers, body,
                         head=request.method == b"HEAD")
        if wrote.cancelled_caught or connection.our_state is not h11.DONE \
                or connection.their_state is not h11.DONE:
            return
        connection.start_next_cycle()


async def _read_request(stream: trio.SocketStream, connection: h11.Connection,
                        config: MetricsConfig) -> h11.Request | None:
    """The next request, its body read and dropped (at most ``max_request_bytes``);
    None when the client closed."""
    request = None
    body = 0
    head = 0   # bytes read before the request line and headers were whole
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(READ_SIZE)
            if request is None:
                head += len(data)
                if head > config.max_request_bytes:
                    raise h11.RemoteProtocolError("request line and headers too large", 431)
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += len(event.data)
            if body > config.max_request_bytes:
                raise h11.RemoteProtocolError("request body too large", 413)
        elif isinstance(event, h11.EndOfMessage):
            return request
        else:   # ConnectionClosed, or PAUSED
            return None


def _answer(request: h11.Request, answer: Answer) -> tuple[int, list[tuple[str, str]], bytes]:
    if request.method not in (b"GET", b"HEAD"):
        return 405, [("allow", "GET, HEAD")], b"only GET and HEAD\n"
    return answer(request.target.split(b"?", 1)[0].decode("ascii", "replace"))


async def _write(stream: trio.SocketStream, connection: h11.Connection, status: int,
                 headers: list[tuple[str, str]], body: bytes, *, head: bool) -> None:
    all_headers: list[tuple[str, Any]] = [*headers, ("content-length", str(len(body)))]
    if "content-type" not in {name for name, _ in headers}:
        all_headers.append(("content-type", "text/plain; charset=utf-8"))
    out = connection.send(h11.Response(status_code=status, headers=all_headers,
                                       reason=http.HTTPStatus(status).phrase.encode()))
    if not head and body:
        out += connection.send(h11.Data(data=body))
    out += connection.send(h11.EndOfMessage())
    await stream.send_all(out)


def _raw_response(status: int, text: str) -> bytes:
    """A whole response that closes the connection, without h11 (whose state
    a malformed request has broken)."""
    body = text.encode()
    reason = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ \
        else "Error"
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


async def _refuse_busy(stream: trio.SocketStream, what: str) -> None:
    with trio.move_on_after(CLOSE_LINGER):
        try:
            await stream.send_all(_raw_response(503, f"busy: too many {what} connections\n"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await _close(stream)


async def _close(stream: trio.SocketStream) -> None:
    """Close after the answer: end our side, then read and drop what the
    client still sends (at most CLOSE_DRAIN_BYTES, CLOSE_LINGER seconds), so
    that unread input does not make the kernel reset the connection before
    the client has read the answer."""
    with trio.move_on_after(CLOSE_LINGER):
        try:
            await stream.send_eof()
            drained = 0
            while drained < CLOSE_DRAIN_BYTES:
                data = await stream.receive_some(READ_SIZE)
                if not data:
                    break
                drained += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)
