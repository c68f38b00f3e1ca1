"""simulations/_harness.py: the supervisor, the event protocol and the CPU meter, with
tiny python children."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from simulations._harness import (
    CpuMeter,
    RunFailed,
    Supervisor,
    cores,
    describe,
    machine_jiffies,
    process_cpu_s,
    thread_cpu_s,
)

ROOT = Path(__file__).resolve().parents[1]


def child(code: str) -> list[str]:
    """argv of a python child running ``code`` (after importing the harness as h)."""
    return [sys.executable, "-c", "from simulations import _harness as h\n"
            + textwrap.dedent(code)]


def gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (absent, or a zombie waiting for init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids: list[int], seconds: float = 3.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


PEER = """
    import sys
    rank = int(sys.argv[1])
    print("some library's chatter on stdout")
    peers = h.exchange({"rank": rank, "secret": 10 * rank}, timeout=5)
    h.emit("ready", rank=rank, peers=peers)
    go = h.wait_command("go", timeout=5)
    h.emit("done", rank=rank, value=go["value"] + rank)
    h.wait_command("stop", timeout=5)
"""


@pytest.mark.timeout(10)
def test_two_children_exchange_and_answer_commands(tmp_path):
    with Supervisor(log_dir=tmp_path, timeout=8, exit_grace=3) as sup:
        for rank in range(2):
            sup.start([*child(PEER), str(rank)])
        assert sup.exchange() == [{"rank": 0, "secret": 0}, {"rank": 1, "secret": 10}]
        ready = sup.wait_all("ready")
        assert ready[1]["peers"] == [{"rank": 0, "secret": 0}, {"rank": 1, "secret": 10}]
        before = time.time()
        released = sup.send("go", value=100)
        assert before <= released <= time.time()
        done = sup.wait_all("done")
        assert {r: m["value"] for r, m in done.items()} == {0: 100, 1: 101}
        pids = sup.pids
    # close: stdin closed, the children's wait for stop returned, they exited
    assert wait_gone(pids)
    assert (tmp_path / "rank-0.log").exists()


@pytest.mark.timeout(10)
def test_events_are_matched_by_their_fields():
    code = """
        for r in (0, 1, 2):
            h.emit("tick", round=r, mode="a")
        h.wait_command("stop", timeout=5)
    """
    with Supervisor(timeout=8, exit_grace=2) as sup:
        sup.start(child(code))
        assert sup.wait_all("tick", round=2, mode="a")[0]["round"] == 2
        assert sup.wait_all("tick", round=0)[0]["round"] == 0
        assert sup.find(0, "tick", round=1) is not None
        assert sup.find(0, "tick", round=1) is None
        with pytest.raises(RunFailed, match=r"timed out waiting for 'tick' \(round 0\)"):
            sup.wait_all("tick", round=0, limit=0.3)


@pytest.mark.timeout(10)
def test_a_child_that_dies_is_a_clear_run_failed(tmp_path):
    dies = """
        import sys
        h.emit("ready")
        print("boom: the worker broke", file=sys.stderr)
        sys.exit(3)
    """
    stays = """
        h.emit("ready")
        h.wait_command("stop", timeout=5)
    """
    with Supervisor(name="bench", log_dir=tmp_path, timeout=8, exit_grace=2) as sup:
        sup.start(child(stays))
        sup.start(child(dies))
        sup.wait_all("ready")
        with pytest.raises(RunFailed) as failed:
            sup.wait_all("done")
    message = str(failed.value)
    assert message.startswith("bench: rank 1 exited (status 3) before 'done'"), message
    assert "boom: the worker broke" in message


@pytest.mark.timeout(10)
def test_a_fatal_event_is_a_run_failed_with_the_childs_error():
    code = """
        with h.reporting(rank=0):
            h.emit("ready")
            raise ValueError("bad input\\nsecond line")
    """
    with Supervisor(timeout=8, exit_grace=2) as sup:
        sup.start(child(code))
        with pytest.raises(RunFailed, match=r"rank 0: ValueError: bad input"):
            sup.wait_all("done")


@pytest.mark.timeout(10)
def test_a_child_waiting_for_a_command_gives_up_at_its_timeout():
    code = """
        with h.reporting():
            h.wait_command("go", timeout=0.3)
    """
    with Supervisor(timeout=8, exit_grace=2) as sup:
        sup.start(child(code))
        with pytest.raises(RunFailed, match="TimeoutError"):
            sup.wait_all("done")


@pytest.mark.timeout(10)
def test_a_zero_timeout_looks_once_for_a_command_already_sent():
    code = """
        import time
        with h.reporting():
            try:
                h.read_command(0)
                h.emit("early", seen=True)
            except TimeoutError:
                h.emit("early", seen=False)
            h.emit("asked")
            time.sleep(0.5)   # the parent's "go" is waiting by now
            h.emit("done", command=h.read_command(0)["command"])
    """
    with Supervisor(timeout=8, exit_grace=2) as sup:
        sup.start(child(code))
        assert sup.wait_all("early")[0]["seen"] is False
        sup.wait_all("asked")
        sup.send("go")
        assert sup.wait_all("done")[0]["command"] == "go"


@pytest.mark.timeout(10)
def test_a_timeout_kills_every_child_and_what_they_started():
    # Each child starts a grandchild, ignores SIGTERM and never answers: the
    # supervisor must escalate to SIGKILL and take the whole process group.
    code = """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        h.emit("started", grandchild=grandchild.pid)
        time.sleep(60)
    """
    began = time.monotonic()
    with Supervisor(timeout=8, exit_grace=0.2) as sup:
        for _ in range(2):
            sup.start(child(code))
        grandchildren = [m["grandchild"] for m in sup.wait_all("started").values()]
        with pytest.raises(RunFailed, match=r"timed out waiting for 'never' \(from ranks \[\] "
                                            r"of \[0, 1\]\)"):
            sup.wait_all("never", limit=0.5)
        pids = sup.pids
    assert wait_gone(pids + grandchildren, 1.0), "children or grandchildren left running"
    assert time.monotonic() - began < 8


@pytest.mark.timeout(10)
def test_ctrl_c_inside_the_block_kills_and_reaps_the_children():
    code = """
        import time
        h.emit("up")
        time.sleep(60)
    """
    with pytest.raises(KeyboardInterrupt):
        with Supervisor(timeout=8, exit_grace=0.2) as sup:
            sup.start(child(code))
            sup.wait_all("up")
            pids = sup.pids
            raise KeyboardInterrupt
    assert wait_gone(pids, 1.0)
    assert sup.returncode(0) is not None  # reaped: no zombie of ours left


@pytest.mark.timeout(10)
def test_wait_exit_returns_statuses_and_keeps_the_events():
    code = """
        import sys
        h.emit("result", value=1)
        h.fatal(RuntimeError("the teardown failed"))
        sys.exit(1)
    """
    with Supervisor(timeout=8, exit_grace=1) as sup:
        sup.start(child(code))
        assert sup.wait_all("result")[0]["value"] == 1
        assert sup.wait_exit() == {0: 1}
        assert sup.find(0, "fatal")["error"] == "RuntimeError: the teardown failed"


@pytest.mark.timeout(10)
def test_children_start_through_a_hosts_popen_outside_a_new_session():
    calls = []

    class Host:  # what Supervisor needs of a netlab host
        def popen(self, argv, **kwargs):
            calls.append(kwargs["start_new_session"])
            return subprocess.Popen(argv, **kwargs)

    with Supervisor(timeout=8, exit_grace=2) as sup:
        sup.start(child('h.emit("up", pgid=__import__("os").getpgid(0))'), host=Host())
        sup.start(child('h.emit("up", pgid=__import__("os").getpgid(0))'))
        up = sup.wait_all("up")
        pids = sup.pids
    assert calls == [False]
    assert up[0]["pgid"] == os.getpgid(0)  # the parent's group
    assert up[1]["pgid"] == pids[1]  # a group of its own


@pytest.mark.timeout(10)
def test_a_wait_without_any_bound_is_refused():
    with Supervisor(exit_grace=1) as sup:
        sup.start(child('h.emit("up")'))
        with pytest.raises(ValueError, match="unbounded"):
            sup.wait_all("up")
        assert sup.wait_all("up", limit=5)[0]["event"] == "up"


@pytest.mark.timeout(10)
def test_a_program_that_cannot_start_is_a_run_failed():
    with Supervisor(timeout=5) as sup, pytest.raises(RunFailed, match="cannot start rank 0"):
        sup.start(["/nonexistent/program"])


@pytest.mark.timeout(10)
def test_describe_names_the_first_leaf_of_a_group():
    group_type = getattr(builtins, "BaseExceptionGroup", None)  # Python 3.11+
    if group_type is not None:
        inner = group_type("inner", [KeyError("k"), ValueError("v")])
        assert describe(group_type("outer", [inner])) == "KeyError: 'k'"
    assert describe(TimeoutError("late\nmore")) == "TimeoutError: late"


@pytest.mark.timeout(10)
def test_cpu_meter_measures_this_process_a_child_and_the_machine():
    spin = """
        import time
        h.emit("up")
        end = time.process_time() + 5
        while time.process_time() < end:
            pass
    """
    with Supervisor(timeout=8, exit_grace=0.1) as sup:
        sup.start(child(spin))
        sup.wait_all("up")
        meter = CpuMeter([None, sup.pids[0]])
        before = meter.sample()
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:  # busy here too
            pass
        usage = meter.sample().usage_since(before)
    assert 0.35 <= usage.wall_s < 2.0
    mine, theirs = usage.cpu_s
    assert 0.02 < mine <= usage.wall_s + 0.05
    assert 0.0 < theirs <= usage.wall_s + 0.05
    assert usage.total_cpu_s == pytest.approx(mine + theirs)
    assert 0.0 < usage.core_fraction <= 2.1
    assert 0.0 < usage.cores_fraction() <= 1.05
    assert usage.cores_fraction(1) == pytest.approx(usage.core_fraction)
    assert 0.0 < usage.machine_busy_fraction <= 1.0


@pytest.mark.timeout(10)
def test_cpu_meter_samples_in_the_background():
    meter = CpuMeter(pids=()).start(interval=0.05)
    t0 = time.time()
    time.sleep(0.3)
    t1 = time.time()
    meter.stop()
    usage = meter.usage_between(t0, t1)
    assert usage is not None and usage.cpu_s == ()
    assert 0.0 <= usage.machine_busy_fraction <= 1.0
    assert meter.usage_between(t1 + 100, t1 + 200) is None


@pytest.mark.timeout(10)
def test_cpu_readings_are_sane():
    assert cores() >= 1
    busy, total = machine_jiffies()
    assert 0 <= busy <= total
    assert process_cpu_s() > 0
    assert process_cpu_s(os.getpid()) > 0
    assert process_cpu_s(2**22 + 12345) is None  # no such process
    threads = thread_cpu_s()
    assert "MainThread" in threads and all(v >= 0 for v in threads.values())
