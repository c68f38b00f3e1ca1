"""Nothing is left behind: on exit, on errors, on Ctrl-C, and after a crashed run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from p2pdl import netlab
from p2pdl.errors import ConfigError
from p2pdl.netlab import Internet

from .conftest import lab_names, read_line

pytestmark = pytest.mark.usefixtures("lab_required")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _build(net: Internet) -> None:
    net.add_public_host("relay", rate_mbit=10)
    gateway = net.add_nat("nat1")
    net.add_private_host("a", behind=gateway, rate_mbit=10)
    assert len(lab_names(net.run_id)) == 4


def test_leaving_the_block_removes_everything():
    with Internet() as net:
        _build(net)
        record = f"/run/p2pdl-netlab/{net.run_id}"
        assert os.path.exists(record)
    assert net.closed
    assert lab_names(net.run_id) == [] and not os.path.exists(record)
    net.close()  # idempotent


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_error_in_the_block_removes_everything_and_propagates(error: type[BaseException]):
    with pytest.raises(error, match="from the body"), Internet() as net:
        _build(net)
        raise error("from the body")
    assert lab_names(net.run_id) == []


def test_processes_are_terminated_then_killed_before_the_namespaces_go():
    with Internet(term_timeout=0.5) as net:
        _build(net)
        polite = net["relay"].popen(["sleep", "60"])
        stubborn = net["a"].popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE, text=True)
        assert read_line(stubborn) == "ready"
        # A grandchild that the lab never saw started: found in the namespace all the same.
        parent = net["nat1"].popen(["sh", "-c", "sleep 60 & echo $!; wait"],
                                   stdout=subprocess.PIPE, text=True)
        grandchild = int(read_line(parent))
        started = time.monotonic()
    assert time.monotonic() - started < 0.5 + 2.5
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert parent.returncode is not None and not _alive(grandchild)
    assert lab_names(net.run_id) == []


def test_ctrl_c_during_close_is_held_back_until_everything_is_removed():
    net = Internet(term_timeout=1.0)
    stubborn = net.add_public_host("relay").popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    assert read_line(stubborn) == "ready"
    # Ctrl-C while close() waits for the process that ignores SIGTERM.
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            net.close()
    finally:
        timer.join()
    assert stubborn.returncode == -signal.SIGKILL
    assert net.closed and lab_names(net.run_id) == []


def _run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=30)


def test_a_lab_never_closed_is_removed_at_interpreter_exit():
    result = _run_child("""
        from p2pdl.netlab import Internet
        net = Internet()
        net.add_private_host("a", behind=net.add_nat("nat1"))
        print(net.run_id)
    """)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    assert run_id not in netlab.runs_present()


def test_cleanup_removes_the_leftovers_of_a_crashed_run_and_keeps_live_ones():
    # The child builds a lab, starts a process in it, and dies without any
    # cleanup (os._exit skips `with`, finally and atexit alike).
    result = _run_child("""
        import os, subprocess
        from p2pdl.netlab import Internet
        net = Internet()
        host = net.add_private_host("a", behind=net.add_nat("nat1"), rate_mbit=5)
        sleeper = host.popen(["sleep", "60"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        print(net.run_id, sleeper.pid, flush=True)
        os._exit(0)
    """)
    assert result.returncode == 0, result.stderr
    run_id, pid = result.stdout.split()
    assert len(lab_names(run_id)) == 3 and _alive(int(pid))
    with Internet() as live:
        live.add_public_host("relay")
        removed = netlab.cleanup()  # also any other dead run on this machine
        assert {f"p2nl-{run_id}", f"p2nl-{run_id}-a", f"p2nl-{run_id}-nat1"} <= set(removed)
        assert lab_names(run_id) == [] and run_id not in netlab.runs_present()
        assert not _alive(int(pid))
        assert lab_names(live.run_id) == [live.netns, live["relay"].netns]  # untouched
        # A named run goes whatever its state; closing it afterwards is fine.
        assert netlab.cleanup(live.run_id) == [live["relay"].netns, live.netns]
    assert lab_names(live.run_id) == []


def test_cleanup_of_an_unknown_or_invalid_run():
    unused = next(f"{i:04x}" for i in range(1 << 16) if f"{i:04x}" not in netlab.runs_present())
    assert netlab.cleanup(unused) == []
    with pytest.raises(ConfigError, match="invalid run id"):
        netlab.cleanup("not-a-run")
