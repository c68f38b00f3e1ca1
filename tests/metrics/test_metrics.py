"""Prometheus metrics: the naming rule, ``/metrics`` on a real node, the HTTP
server's bounds, and the sync face."""

from __future__ import annotations

import dataclasses
import threading
import urllib.request

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import p2pdl
from p2pdl.errors import ConfigError
from p2pdl.metrics import MetricsConfig, metric_families, parse_address, serve_metrics
from p2pdl.service import Statistics
from p2pdl.testing import loopback_config

pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass(frozen=True)
class RunRecord(Statistics):
    run_id: str
    peers: int
    pushes: int = 0


@dataclasses.dataclass(frozen=True)
class ServiceRecord(Statistics):
    mode: str
    healthy: bool
    paths: dict
    runs: list
    names: list
    sent: int = 0


@dataclasses.dataclass(frozen=True)
class Record(Statistics):
    connected_peers: int
    echo: ServiceRecord


def families(record) -> dict:
    return {f.name: f for f in metric_families(record)}


def test_the_naming_rule():
    record = Record(3, ServiceRecord("server", True, {"direct": 2, "relayed": 1},
                                     [RunRecord("a", 4, 7), RunRecord("b", 1)], ["x", "y"],
                                     sent=12))
    found = families(record)
    assert found["p2pdl_connected_peers"].type == "gauge"
    assert found["p2pdl_connected_peers"].samples[0].value == 3
    sent = found["p2pdl_echo_sent"]   # a counter: exposed as p2pdl_echo_sent_total
    assert sent.type == "counter" and sent.samples[0].value == 12
    assert found["p2pdl_echo_mode_info"].samples[0].labels == {"mode": "server"}
    assert found["p2pdl_echo_healthy"].samples[0].value == 1.0
    paths = {s.labels["path"]: s.value for s in found["p2pdl_echo_paths"].samples}
    assert paths == {"direct": 2, "relayed": 1}
    peers = {s.labels["run_id"]: s.value for s in found["p2pdl_echo_runs_peers"].samples}
    assert peers == {"a": 4, "b": 1}
    assert found["p2pdl_echo_runs_pushes"].type == "counter"   # a run's counter, by run
    assert found["p2pdl_echo_names"].samples[0].value == 2    # a list: its length
    assert "p2pdl_echo_runs_run_id_info" not in found          # the run id is a label


@pytest.mark.parametrize("bad", ["9100", "localhost", ":9100", "host:port", "h:70000", ""])
def test_a_bad_address_is_one_clear_error(bad):
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_address(bad)


def test_addresses():
    assert parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_address("[::1]:0") == ("::1", 0)


async def http(port: int, request: bytes, *, read_all: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        with trio.fail_after(10):
            while True:
                chunk = await stream.receive_some(1 << 16)
                if not chunk:
                    return data
                data += chunk
                if not read_all and b"\r\n\r\n" in data:
                    return data


def body_of(response: bytes) -> str:
    return response.split(b"\r\n\r\n", 1)[1].decode()


GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

def documented() -> set[str]:
    """The metric families docs/metrics.md names (labels and ``_total`` taken off)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    names = set(re.findall(r"`((?:p2pdl|process)_[a-z0-9_]+)(?:\{[^`]*\})?(?: 1)?`", text))
    return {name.removesuffix("_total") for name in names if "<" not in name}


#: Metrics that must be on a running node's page, besides what docs/metrics.md names.
DOCUMENTED = ["p2pdl_connected_peers", "p2pdl_paths", "p2pdl_reachability_info",
              "p2pdl_client_mode", "p2pdl_relay_reservations", "p2pdl_dht_routing_table",
              "p2pdl_dht_queries", "p2pdl_dht_stores", "p2pdl_dht_gets",
              "p2pdl_matchmaking_formed", "p2pdl_matchmaking_failed", "p2pdl_allreduce_rounds",
              "p2pdl_allreduce_completed", "p2pdl_allreduce_incomplete",
              "p2pdl_allreduce_parts_check_failed", "p2pdl_progress_runs_peers",
              "p2pdl_progress_runs_reports_accepted", "p2pdl_statesync_bytes_served",
              "p2pdl_admission_refused", "process_cpu_seconds", "process_resident_memory_bytes"]


async def test_a_node_serves_its_statistics_to_prometheus():
    async with p2pdl.open_node(loopback_config()) as node, \
            node.progress.track("metrics-run", 64):
        host, port = await node.nursery.start(serve_metrics, node, "127.0.0.1:0")
        assert host == "127.0.0.1" and port > 0
        response = await http(port, GET)
        assert response.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-type: text/plain; version=" in response.lower()
        found = {f.name: f for f in text_string_to_metric_families(body_of(response))}
        assert len(documented()) > 25
        missing = [name for name in [*DOCUMENTED, *documented()] if name not in found]
        assert not missing, missing
        assert found["p2pdl_dht_queries"].type == "counter"
        runs = {s.labels["run_id"] for s in found["p2pdl_progress_runs_peers"].samples}
        assert runs == {"metrics-run"}
        assert {s.labels["path"] for s in found["p2pdl_paths"].samples} \
            == {"direct", "hole-punched", "relayed"}
        node.nursery.cancel_scope.cancel()


async def test_paths_methods_keep_alive_and_bad_requests():
    async with p2pdl.open_node(loopback_config()) as node:
        config = MetricsConfig(max_request_bytes=512, request_timeout=0.5)
        _, port = await node.nursery.start(
            lambda task_status: serve_metrics(node, "127.0.0.1:0", config=config,
                                              task_status=task_status))
        assert (await http(port, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                ).startswith(b"HTTP/1.1 404 ")
        post = await http(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                b"Connection: close\r\n\r\nhi")
        assert post.startswith(b"HTTP/1.1 405 ") and b"allow: get, head" in post.lower()
        head = await http(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # no body
        two = await http(port, GET.replace(b"Connection: close\r\n", b"") + GET)
        assert two.count(b"HTTP/1.1 200 OK") == 2          # keep-alive, then close
        assert (await http(port, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 2000 + b"\r\n\r\n"
        assert (await http(port, big)).startswith(b"HTTP/1.1 431 ")
        with trio.fail_after(5):   # a client that says nothing is cut off
            assert await http(port, b"GET /metr") == b""
        assert (await http(port, GET)).startswith(b"HTTP/1.1 200 ")   # still serving
        node.nursery.cancel_scope.cancel()


async def test_connections_beyond_the_limit_are_answered_busy():
    async with p2pdl.open_node(loopback_config()) as node:
        config = MetricsConfig(max_connections=1, request_timeout=5)
        _, port = await node.nursery.start(
            lambda task_status: serve_metrics(node, "127.0.0.1:0", config=config,
                                              task_status=task_status))
        idle = await trio.open_tcp_stream("127.0.0.1", port)   # holds the only slot
        await trio.sleep(0.1)
        assert (await http(port, GET)).startswith(b"HTTP/1.1 503 ")
        await idle.aclose()
        with trio.fail_after(5):
            while not (await http(port, GET)).startswith(b"HTTP/1.1 200 "):
                await trio.sleep(0.05)
        node.nursery.cancel_scope.cancel()


async def test_an_address_in_use_is_a_config_error():
    async with p2pdl.open_node(loopback_config()) as node:
        _, port = await node.nursery.start(serve_metrics, node, "127.0.0.1:0")
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            await node.nursery.start(serve_metrics, node, f"127.0.0.1:{port}")
        node.nursery.cancel_scope.cancel()


def test_a_sync_node_serves_metrics_until_it_shuts_down():
    from p2pdl.metrics import start_metrics

    node = p2pdl.Node(listen=["/ip4/127.0.0.1/tcp/0"], handle_sigterm=False)
    try:
        host, port = start_metrics(node, "127.0.0.1:0")
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        assert "p2pdl_connected_peers" in text and threading.current_thread().name
    finally:
        node.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2)
