"""Measuring what a link in the lab really carries: one bulk TCP transfer.

For checking that a scenario's caps hold (tests, ``simulations/bench_netlab.py``)
and for users who build their own topologies.  The two ends are small Python
programs run inside the hosts with this interpreter; the receiver times the
transfer from its first byte to its last.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading

from ..errors import ConfigError
from ._errors import NetlabError
from ._host import Host, Namespace

__all__ = ["Throughput", "measure_throughput"]

# argv: role (send|receive), how (listen|connect), host, port, nbytes, timeout
_PROGRAM = r"""
import json, signal, socket, sys, time
role, how, host, port, nbytes, timeout = sys.argv[1:]
port, nbytes, timeout = int(port), int(nbytes), float(timeout)
signal.alarm(int(timeout) + 2)
if how == "listen":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1)
    print("ready", flush=True)
    conn = server.accept()[0]
else:
    conn = socket.create_connection((host, port), timeout=timeout)
conn.settimeout(timeout)
if role == "send":
    chunk = bytes(1 << 20)
    left = nbytes
    while left > 0:
        conn.sendall(chunk[:left])
        left -= min(left, len(chunk))
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # until the receiver closes: every byte arrived
else:
    buf = bytearray(1 << 20)
    total, first, last = 0, None, None
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        last = time.monotonic()
        first = first if first is not None else last
        total += n
    print(json.dumps({"bytes": total, "seconds": last - first if total else 0.0}), flush=True)
"""


@dataclasses.dataclass(frozen=True)
class Throughput:
    """The result of one transfer: payload bytes, seconds, and the rate in Mbit/s."""

    bytes: int
    seconds: float

    @property
    def mbit_per_s(self) -> float:
        """TCP payload rate in Mbit/s (10**6 bit/s), as the caps are given."""
        return self.bytes * 8 / self.seconds / 1e6 if self.seconds > 0 else float("inf")


def _reachable(listener: Namespace, dialer: Namespace) -> bool:
    if not isinstance(listener, Host) or listener.is_public:
        return True  # public hosts and gateways have public addresses
    return isinstance(dialer, Host) and dialer.gateway is listener.gateway


def measure_throughput(sender: Namespace, receiver: Namespace, nbytes: int, *,
                       port: int = 5201, timeout: float = 60.0) -> Throughput:
    """Send ``nbytes`` from ``sender`` to ``receiver`` over one TCP connection; time it.

    The receiver listens on ``port`` if the sender can reach it (it is public,
    or both are on one LAN); otherwise the receiver dials the sender, as a
    private host does.  Raises :class:`~p2pdl.errors.ConfigError` if neither
    can reach the other (two hosts behind different NATs: use a relay), and
    :class:`NetlabError` if the transfer fails or takes over ``timeout`` s.
    """
    if _reachable(receiver, sender):
        listener, dialer, listener_role, dialer_role = receiver, sender, "receive", "send"
    elif _reachable(sender, receiver):
        listener, dialer, listener_role, dialer_role = sender, receiver, "send", "receive"
    else:
        raise ConfigError(f"{sender.name!r} and {receiver.name!r} are behind different NATs: "
                          f"neither can dial the other")
    server = listener.popen([sys.executable, "-c", _PROGRAM, listener_role, "listen", "-",
                             str(port), str(nbytes), str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if not _wait_ready(server, timeout):
            server.kill()
            raise NetlabError(f"the listening end in {listener.name!r} did not start: "
                              f"{_last_line(server.communicate(timeout=5)[1])}")
        client = dialer.run([sys.executable, "-c", _PROGRAM, dialer_role, "connect",
                             listener.ip, str(port), str(nbytes), str(timeout)],
                            capture_output=True, text=True, timeout=timeout + 5)
        # communicate() reads the raw pipe, past the text buffer that read
        # "ready": safe, because the listener prints nothing else before it ends.
        out, err = server.communicate(timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        raise NetlabError(f"a transfer of {nbytes} bytes from {sender.name!r} to "
                          f"{receiver.name!r} took over {timeout:g} s") from None
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if client.returncode != 0 or server.returncode != 0:
        raise NetlabError(f"the transfer from {sender.name!r} to {receiver.name!r} failed: "
                          f"{_last_line(client.stderr if client.returncode else err)}")
    report = json.loads((out if listener_role == "receive" else client.stdout).splitlines()[-1])
    return Throughput(report["bytes"], report["seconds"])


def _wait_ready(server: subprocess.Popen, timeout: float) -> bool:
    """Whether the listening end printed ``ready`` within ``timeout`` seconds."""
    # Read in a thread: a pipe has no read timeout.  On timeout the thread
    # ends when the caller kills the process.
    line: list[str] = []
    assert server.stdout is not None
    reader = threading.Thread(target=lambda: line.append(server.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return bool(line) and line[0].strip() == "ready"


def _last_line(text: str) -> str:
    """The last line of a program's stderr: the exception, for a Python traceback."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no output)"
