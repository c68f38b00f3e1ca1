"""``p2pdl train``, run as real processes on loopback."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from p2pdl.cli import main

LOOPBACK = ["--listen", "/ip4/127.0.0.1/tcp/0"]


class TrainProcess:
    """``python -m p2pdl train ...`` with its stdout read line by line in a thread."""

    def __init__(self, args: Sequence[str]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "p2pdl", "train", *LOOPBACK, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.stderr = ""
        self._stdout = threading.Thread(target=self._read_stdout, daemon=True)
        self._stderr = threading.Thread(target=self._read_stderr, daemon=True)
        self._stdout.start()
        self._stderr.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def wait_for_event(self, predicate: Callable[[dict[str, Any]], bool],
                       timeout: float) -> dict[str, Any]:
        """The first JSON event (from now on) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no such event within {timeout} s; last: "
                                     f"{self.events[-3:]}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the process ended (status {self.proc.wait()}); "
                                     f"stderr: {self.stderr[-2000:]}")
            event = json.loads(line)  # every stdout line is one JSON object
            self.events.append(event)
            if predicate(event):
                return event

    def finish(self, timeout: float) -> int:
        """Wait for the exit, read the rest of the output; the exit status."""
        code = self.proc.wait(timeout)
        self._stdout.join(5)
        self._stderr.join(5)
        while True:
            line = self.lines.get_nowait() if not self.lines.empty() else None
            if line is None:
                break
            self.events.append(json.loads(line))
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def run_two(common: Sequence[str], check_ready: Callable[[dict[str, Any]], None],
            on_first: Callable[[str], None] | None = None
            ) -> tuple[TrainProcess, TrainProcess]:
    """Two trainers with ``common`` flags, peer 1 joining peer 0 (whose ``ready``
    event ``check_ready`` sees first, and ``on_first`` its address); both must
    exit with status 0."""
    first = TrainProcess([*common, "--peer-index", "0"])
    second = None
    try:
        ready = first.wait_for_event(lambda e: e["event"] == "ready", 60)
        check_ready(ready)
        if on_first is not None:
            on_first(ready["addrs"][0])
        second = TrainProcess([*common, "--peer-index", "1",
                               "--initial-peers", ready["addrs"][0]])
        for proc in (first, second):
            assert proc.finish(timeout=90) == 0, proc.stderr
    finally:
        first.kill()
        if second is not None:
            second.kill()
    return first, second


def run_p2pdl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2pdl", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(60)
def test_train_help_lists_the_flags():
    result = run_p2pdl("train", "--help")
    assert result.returncode == 0
    for flag in ("--run-id", "--initial-peers", "--target-batch-size", "--batch-size",
                 "--client-mode", "--auxiliary", "--mode", "--delay-updates", "--peer-index",
                 "--max-epochs", "--duration", "--threads", "--bandwidth", "--eval-every",
                 "--json-lines", "--checkpoint-dir", "--matchmaking-time", "--aggregator",
                 "--tau", "--clip-sent-norm", "--metrics", "--codec", "--fragments"):
        assert flag in result.stdout


@pytest.mark.timeout(60)
def test_help_lists_train_and_demo():
    out = run_p2pdl("--help").stdout
    commands = out.split("positional arguments:")[1].split("options:")[0]
    listed = {line.split()[0] for line in commands.splitlines()
              if line.startswith("    ") and not line.startswith("     ")}
    assert {"node", "train", "demo"} <= listed


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, message", [
    (["--target-batch-size", "0"], "--target-batch-size: must be a positive integer"),
    (["--batch-size", "many"], "--batch-size: must be a positive integer"),
    (["--lr", "-1"], "--lr: must be a positive number"),
    (["--duration", "nan"], "--duration: must be a positive number"),
    (["--discovery-time", "-1"], "--discovery-time: must be a number >= 0"),
    (["--mode", "sgd"], "invalid choice"),
    (["--client-mode", "--auxiliary"], "not allowed with"),
    (["--peer-index", "-3"], "--peer-index: must be an integer >= 0"),
    (["--aggregator", "krum"], "invalid choice"),
    (["--codec", "zstd"], "invalid choice"),
    (["--tau", "0"], "--tau: must be a positive number"),
    (["--fragments", "0"], "--fragments: must be a positive integer"),
    (["--tau", "automatic"], "--tau: must be a positive number or 'auto'"),
    (["--name", "bell\x07"], "--name: name is not 1 to 64 printable characters"),
])
def test_bad_flags_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *LOOPBACK, *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, message", [
    # Checked once the node or the optimizer starts, and still a one-line error.
    (["--initial-peers", "localhost:4001", "--duration", "1"], "is not a multiaddr"),
    (["--run-id", "x" * 200, "--duration", "1"], "run_id must be"),
    (["--resume-from", "/nonexistent/copies", "--duration", "1"], "no intact checkpoint"),
    (["--fragments", "2", "--duration", "1"], "fragments applies to mode='diloco' only"),
])
def test_bad_input_is_a_one_line_error(args, message):
    result = run_p2pdl("train", *LOOPBACK, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(150)
def test_two_trainers_reach_epoch_two_together_and_a_monitor_credits_them(tmp_path):
    common = ["--json-lines", "--target-batch-size", "64", "--max-epochs", "2",
              "--wait-for-peers", "2", "--matchmaking-time", "5", "--run-id", "two-peers",
              "--name", "volunteer"]
    def check_ready(ready: dict[str, Any]) -> None:
        assert ready["role"] == "trainer" and ready["peer_index"] == 0
        assert all(a.startswith("/ip4/127.0.0.1/tcp/") for a in ready["addrs"])

    monitors: list[subprocess.Popen[str]] = []
    export = tmp_path / "credits.json"

    def start_monitor(address: str) -> None:
        monitors.append(subprocess.Popen(
            [sys.executable, "-m", "p2pdl", "monitor", *LOOPBACK, "--run-id", "two-peers",
             "--initial-peers", address, "--db", str(tmp_path / "credits.sqlite"),
             "--target-batch-size", "64", "--status-interval", "1", "--export", str(export),
             "--http", "127.0.0.1:0", "--backup-dir", str(tmp_path / "copies"),
             "--backup-every", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    try:
        first, second = run_two(common, check_ready, start_monitor)
        time.sleep(1.5)   # a last look at the view
        monitors[0].send_signal(signal.SIGINT)
        out, err = monitors[0].communicate(timeout=20)
    finally:
        for proc in monitors:
            proc.kill()
    assert monitors[0].returncode == 0 and "Traceback" not in err, err
    assert "leaderboard of two-peers" in out and any(
        line.startswith("monitor: run two-peers | epoch ") for line in out.splitlines()), out
    credits = json.loads(export.read_text())
    trainers = {proc.events[0]["peer_id"] for proc in (first, second)}
    # Credited: trainers only (never the monitor), at most a target batch per
    # epoch.  (An epoch of 64 samples passes in about a second: a trainer's
    # reports may reach the monitor only after it counted.)
    credited = {s["peer_id"] for s in credits["leaderboard"]}
    assert credited and credited <= trainers, (out, credits)
    assert all(s["name"] == "volunteer" for s in credits["leaderboard"]), credits
    assert "(volunteer)" in out, out
    assert re.search(r"^dashboard: http://127\.0\.0\.1:\d+/$", out, re.M), out
    assert f"backups: every 1 epoch(s) in {tmp_path / 'copies'}" in out, out
    assert all(0 < c["samples"] <= 64 and c["epoch"] in (0, 1) for c in credits["credits"])
    for proc in (first, second):
        assert "Traceback" not in proc.stderr, proc.stderr
        kinds = [e["event"] for e in proc.events]
        assert kinds[0] == "ready" and kinds[-1] == "done"
        assert "started" in kinds and "step" in kinds
        done = proc.events[-1]
        assert done["reason"] == "max-epochs" and done["epoch"] >= 2
        assert done["statistics"]["averaged"] >= 1  # they did average together
        steps = [e for e in proc.events if e["event"] == "step"]
        assert max(e["peers"] for e in steps) in (2, 3)   # the monitor: an auxiliary peer
        assert all(e["target"] == 64 for e in steps)
    # Same start, same averaged gradients: the same parameters, the same held-out
    # loss -- when every round averaged (a failed one steps with local gradients).
    stats = [proc.events[-1]["statistics"] for proc in (first, second)]
    if all(s["averaged"] == s["rounds"] == s["epoch"] for s in stats):
        assert first.events[-1]["val_loss"] == second.events[-1]["val_loss"], stats


@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_training_quickly_and_quietly(signum):
    proc = TrainProcess(["--json-lines", "--target-batch-size", "64", "--discovery-time", "0"])
    try:
        proc.wait_for_event(lambda e: e["event"] == "step" and e["epoch"] >= 1, 60)
        proc.proc.send_signal(signum)
        start = time.monotonic()
        code = proc.finish(timeout=15)
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
    assert code in (0, 130), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.events[-1]["event"] == "done" and proc.events[-1]["reason"] == "signal"


@pytest.mark.timeout(90)
def test_signal_stops_a_peer_waiting_for_others():
    """... while it serves its metrics (``--metrics``), which show its run."""
    proc = TrainProcess(["--json-lines", "--wait-for-peers", "3", "--wait-timeout", "120",
                         "--metrics", "127.0.0.1:0"])
    try:
        proc.wait_for_event(lambda e: e["event"] == "ready", 60)
        url = proc.wait_for_event(lambda e: e["event"] == "metrics", 10)["url"]
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        assert 'p2pdl_progress_view_epoch{run_id="' in text, text[:2000]
        time.sleep(0.5)
        proc.proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        code = proc.finish(timeout=15)
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
    assert code in (0, 130), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.timeout(90)
def test_human_output_prints_addresses_then_status_lines():
    result = run_p2pdl("train", *LOOPBACK, "--target-batch-size", "32", "--duration", "4",
                       "--status-interval", "1", "--discovery-time", "0", timeout=80)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in lines[0]
    assert any(line.startswith("status: epoch ") and "samples" in line for line in lines)
    assert lines[-1].startswith("done (duration): epoch ")
    assert "Traceback" not in result.stderr


def test_tau_takes_a_number_or_auto():
    from p2pdl.cli._args import tau_value

    assert tau_value("0.5") == 0.5
    assert tau_value("auto") == tau_value(" AUTO ") == "auto"


USER_TASK = '''
import torch

class Regression:
    def __init__(self, fail=""):
        self.batch_size = 8
        self.fail = fail
        self.w = torch.randn(4, generator=torch.Generator().manual_seed(0))

    def build_model(self):
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1)

    def build_optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=0.05)

    def build_scheduler(self, optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)

    def batches(self, peer_index):
        g = torch.Generator().manual_seed(100 + peer_index)
        while True:
            x = torch.randn(self.batch_size, 4, generator=g)
            yield x, x @ self.w

    def loss(self, model, batch):
        x, y = batch
        if self.fail:
            raise ValueError("the user's own bug")
        return torch.nn.functional.mse_loss(model(x).squeeze(-1), y)

    def validation_loss(self, model, max_batches):
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(x).squeeze(-1), x @ self.w))

def make_task(fail=""):
    return Regression(fail)
'''


@pytest.mark.timeout(150)
def test_two_peers_train_a_users_task_together(tmp_path):
    path = tmp_path / "regression_task.py"
    path.write_text(USER_TASK)
    common = ["--json-lines", "--target-batch-size", "32", "--max-epochs", "3",
              "--wait-for-peers", "2", "--matchmaking-time", "5", "--run-id", "user-task",
              "--task", f"{path}:make_task", "--eval-every", "1", "--codec", "uint4"]
    def check_ready(ready: dict[str, Any]) -> None:
        assert ready["task"] == f"{path}:make_task"
        assert ready["batch_size"] == 8 and ready["parameters"] == 5
        assert ready["codec"] == "uint4" and ready["error_feedback"] is True

    first, second = run_two(common, check_ready)
    for proc in (first, second):
        assert "Traceback" not in proc.stderr, proc.stderr
        done = proc.events[-1]
        assert done["event"] == "done" and done["reason"] == "max-epochs", done
        assert done["statistics"]["averaged"] >= 1
        evals = [e["val_loss"] for e in proc.events if e["event"] == "eval"]
        assert len(evals) >= 2 and evals[-1] < evals[0]  # the task's model learns
    stats = [proc.events[-1]["statistics"] for proc in (first, second)]
    if all(s["averaged"] == s["rounds"] == s["epoch"] for s in stats):
        assert first.events[-1]["val_loss"] == second.events[-1]["val_loss"], stats


@pytest.mark.timeout(90)
def test_an_error_in_a_users_task_is_one_line_naming_it(tmp_path):
    path = tmp_path / "buggy_task.py"
    path.write_text(USER_TASK)
    result = run_p2pdl("train", *LOOPBACK, "--task", f"{path}:make_task", "--task-arg",
                       "fail=yes", "--discovery-time", "0", "--max-epochs", "1")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"p2pdl: error: task {path}:make_task: loss() raised ValueError: "
                           f"the user's own bug (at {path}:"), last
