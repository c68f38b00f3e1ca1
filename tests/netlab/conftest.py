"""Fixtures for the emulated-internet tests: skip where the lab cannot run.

Every lab test gets a fresh :class:`~p2pdl.netlab.Internet` and checks at the
end that nothing of its run is left on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from p2pdl import netlab
from p2pdl.netlab import Internet, Namespace

PEER = os.path.join(os.path.dirname(__file__), "_peer.py")


def lab_names(run_id: str) -> list[str]:
    """Namespaces of run ``run_id`` still on the machine."""
    return sorted(n for n in netlab.runs_present().get(run_id, []))


@pytest.fixture
def lab_required() -> None:
    ok, reason = netlab.available()
    if not ok:
        pytest.skip(reason)


@pytest.fixture
def net(lab_required: None) -> Iterator[Internet]:
    with Internet(term_timeout=2.0) as lab:
        yield lab
    assert lab_names(lab.run_id) == []
    assert lab.run_id not in netlab.runs_present()


def peer_argv(*args: object, timeout: float = 10.0) -> list[str]:
    return [sys.executable, PEER, "--timeout", str(timeout), *map(str, args)]


def read_line(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """The next line of ``proc``'s stdout, waiting at most ``timeout`` seconds.

    Read in a helper thread: ``select`` on the pipe would miss lines already
    in the file object's buffer.  On timeout the thread stays blocked until
    the process ends (the lab's close ends it).
    """
    assert proc.stdout is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not line:
        raise TimeoutError(f"no output from {proc.args} within {timeout} s")
    return line[0].strip()


def start_server(host: Namespace, *args: object, timeout: float = 10.0) -> subprocess.Popen:
    """Start a ``_peer.py`` server (serve/sink) in ``host``; return once it listens."""
    proc = host.popen(peer_argv(*args, timeout=timeout), stdout=subprocess.PIPE, text=True)
    assert read_line(proc) == "ready"
    return proc


def run_peer(host: Namespace, *args: object, timeout: float = 10.0) -> tuple[int, dict]:
    """Run a ``_peer.py`` client in ``host``: its exit status and JSON report."""
    result = host.run(peer_argv(*args, timeout=timeout), capture_output=True, text=True,
                      timeout=timeout + 10)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "{}"
    return result.returncode, json.loads(last)
