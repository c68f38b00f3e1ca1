"""The p2pdl command, run as real processes on loopback."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from p2pdl.testing import open_node_process


async def test_second_node_connects_to_the_first_printed_address():
    async with open_node_process() as first:
        assert first.addrs and all(a.startswith("/ip4/127.0.0.1/tcp/") for a in first.addrs)
        async with open_node_process(["--initial-peers", first.addrs[0]]) as second:
            with trio.fail_after(20):
                while not any("1 connected peer" in line for line in second.lines):
                    await trio.sleep(0.1)
                while not any("1 connected peer" in line for line in first.lines):
                    await trio.sleep(0.1)
            assert second.peer_id != first.peer_id


async def test_a_node_serves_prometheus_metrics_where_it_says():
    from prometheus_client.parser import text_string_to_metric_families

    async with open_node_process(["--metrics", "127.0.0.1:0"]) as node:
        line = next(line for line in node.lines if line.startswith("metrics: "))
        url = line.split(" ", 1)[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(1 << 16):
                data += chunk
        names = {f.name for f in text_string_to_metric_families(
            data.split(b"\r\n\r\n", 1)[1].decode())}
        assert {"p2pdl_connected_peers", "p2pdl_dht_queries", "process_cpu_seconds"} <= names


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_the_node_quickly_and_quietly(signum):
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2pdl", "node", "--listen", "/ip4/127.0.0.1/tcp/0",
         "--status-interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until it runs
            if line.startswith("status:"):
                break
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Error" not in err, err


def test_identity_option_keeps_the_peer_id(tmp_path):
    def peer_id() -> str:
        out = subprocess.run(
            [sys.executable, "-m", "p2pdl", "node", "--listen", "/ip4/127.0.0.1/tcp/0",
             "--identity", str(tmp_path / "id.key"), "--duration", "0.1"],
            capture_output=True, text=True, timeout=60, check=True).stdout
        return out.splitlines()[0].rsplit("/p2p/", 1)[1]

    assert peer_id() == peer_id()


@pytest.mark.parametrize("args, message", [
    (["node", "--initial-peers", "localhost:4001"], "is not a multiaddr"),
    (["node", "--listen", "/ip4/127.0.0.1/udp/1"], "must be /ip4"),
    (["node", "--status-interval", "0"], "--status-interval must be positive"),
    (["node", "--metrics", "9100"], "expected HOST:PORT"),
    (["train", "--metrics", "localhost"], "expected HOST:PORT"),
    (["fly"], "invalid choice"),
])
def test_bad_input_is_a_one_line_error(args, message):
    result = subprocess.run([sys.executable, "-m", "p2pdl", *args], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_only_what_works():
    out = subprocess.run([sys.executable, "-m", "p2pdl", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    commands = out.split("positional arguments:")[1].split("options:")[0]
    listed = {line.split()[0] for line in commands.splitlines()
              if line.startswith("    ") and not line.startswith("     ")}
    assert listed == {"node", "train", "monitor", "demo", "identity", "auth", "netlab"}


async def test_relay_node_and_status_line_with_reachability_and_paths():
    async with open_node_process(["--relay"]) as relay:
        async with open_node_process(["--initial-peers", relay.addrs[0]]) as peer:
            with trio.fail_after(30):
                while not any("reachability public" in line and "1 direct" in line
                              for line in peer.lines):
                    await trio.sleep(0.1)
            line = peer.lines[-1]
            assert "accepts connections" in line and "relay reservation(s)" in line


def test_netlab_subcommand_reports_whether_the_lab_can_run():
    result = subprocess.run([sys.executable, "-m", "p2pdl", "netlab", "check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode in (0, 1)
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() or result.stderr.strip()
