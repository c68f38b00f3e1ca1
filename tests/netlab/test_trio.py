"""Running peers inside lab hosts from trio code."""

from __future__ import annotations

import json
import signal
import subprocess

import trio

from p2pdl.netlab import Internet

from .conftest import peer_argv


async def _first_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    with trio.fail_after(10):
        while b"\n" not in data:
            chunk = await stream.receive_some()
            assert chunk, "the process closed its stdout"
            data += chunk
    return data.split(b"\n", 1)[0].decode()


async def test_open_process_runs_inside_the_host(net: Internet):
    relay = net.add_public_host("relay")
    host = net.add_private_host("a", behind=net.add_nat("nat1"))
    server = await relay.open_process(peer_argv("serve", 7000), stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        assert await _first_line(server.stdout) == "ready"
        result = await trio.run_process(host.command(peer_argv("connect", relay.ip, 7000)),
                                        capture_stdout=True)
        assert json.loads(result.stdout)["seen"]["ip"] == host.public_ip
        assert json.loads(await _first_line(server.stdout))["ip"] == host.public_ip
        with trio.fail_after(5):
            assert await server.wait() == 0
    finally:
        server.kill()  # no-op once it has exited
        await server.stdout.aclose()


async def test_a_trio_process_still_running_is_terminated_when_the_lab_closes(net: Internet):
    relay = net.add_public_host("relay")
    sleeper = await relay.open_process(["sleep", "60"])
    net.close()
    with trio.fail_after(5):
        assert await sleeper.wait() == -signal.SIGTERM
