"""``p2pdl demo``: a local swarm as child processes, the baseline, the report."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _children_of(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_trains_a_swarm_and_a_baseline_and_reports(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "p2pdl", "demo", "--duration", "30", "--out", str(out)],
        capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "summary" in result.stdout

    assert (out / "loss.png").read_bytes()[:8] == PNG_MAGIC
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] is False and report["error"] is None
    swarm, solo = report["swarm"], report["solo"]
    assert swarm["last_loss"] < swarm["first_loss"]
    assert solo["last_loss"] < solo["first_loss"]
    assert swarm["val_loss_end"] < swarm["val_loss_start"]
    assert swarm["epochs"] >= 2 and solo["epochs"] >= 2
    roles = {p["name"]: p for p in swarm["peers"]}
    assert set(roles) == {"trainer-0", "trainer-1", "trainer-2", "auxiliary", "relay",
                          "monitor"}
    assert roles["trainer-2"]["client_mode"] is True
    for name in ("trainer-0", "trainer-1", "trainer-2", "auxiliary"):
        peer = roles[name]
        assert peer["finished"] and peer["epoch"] >= 2, peer
        assert peer["statistics"]["averaged"] >= 1, peer
    assert swarm["samples_per_second"] > 0 and solo["samples_per_second"] > 0
    assert report["paths"]["plot"] == str(out / "loss.png")
    for path in report["paths"]["logs"].values():
        assert Path(path).exists()
    for process in report["processes"]:
        assert process["returncode"] is not None
        assert not _alive(process["pid"])

    # A certificate run: the uninvited peer (no certificate) was refused by every
    # member that reported, as their own gate's statistics say.
    membership = report["membership"]
    assert membership["mode"] == "certificate"
    assert set(membership["members"]) == {"relay", "monitor", "trainer-0", "trainer-1",
                                          "trainer-2", "auxiliary"}
    [uninvited] = membership["uninvited"]
    assert uninvited["peer_id"] not in membership["members"].values()
    assert uninvited["membership"] == "open"  # it did not even claim to be a member
    assert uninvited["members"] == uninvited["members_reporting"] == 4
    assert uninvited["refused_by"] == 4 and uninvited["refused_requests"] >= 4
    assert uninvited["averaged"] in (0, None)
    line = re.search(r"uninvited peer (12D3\S+): refused by (\d)/(\d) members \(not_admitted",
                     result.stdout)
    assert line and line.group(2) == line.group(3) == "4", result.stdout[-3000:]
    # The monitor credited the trainers (never the auxiliary peer, the relay or
    # the uninvited peer) from their signed reports, and served metrics.
    credited = {p["name"]: p for p in report["contributions"]["peers"]}
    assert credited and set(credited) <= {"trainer-0", "trainer-1", "trainer-2"}, credited
    assert all(0 < p["samples"] <= 512 * p["epochs"] for p in credited.values())
    assert (out / "credits.sqlite").exists()
    printed = " ".join(result.stdout.split())   # rich wraps long lines
    assert ("contributions (the monitor's credits: samples another member's round took): "
            "trainer-") in printed
    assert re.search(r"dashboard at http://127\.0\.0\.1:\d+/ .*Prometheus metrics at "
                     r"http://127\.0\.0\.1:\d+/metrics", printed)
    # What the dashboard showed last while the trainers trained.
    dashboard = report["dashboard"]
    assert dashboard["answered"] and dashboard["epoch"] >= 2, dashboard
    assert dashboard["leaderboard"] >= 1 and dashboard["peers"] >= 1 and dashboard["points"] >= 2
    assert dashboard["loss"] is not None and dashboard["loss"] > 0


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ctrl_c_stops_every_child_and_writes_a_partial_report(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2pdl", "demo", "--duration", "120", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    training = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "swarm: training" in line:
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    children: list[int] = []
    try:
        assert training.wait(150), "".join(lines[-20:])
        time.sleep(3)
        children = _children_of(proc.pid)
        # relay, monitor, three trainers, the auxiliary and the uninvited peer
        assert len(children) == 7
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        code = proc.wait(60)
        stopped_in = time.monotonic() - start
        reader.join(5)
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert code == 130
    assert stopped_in < 50  # the children get 20 s after SIGTERM, then SIGKILL
    assert "Traceback" not in stderr, stderr
    assert not [pid for pid in children if _alive(pid)]
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] is True
    # The trainers stopped on SIGTERM and still sent their final report.
    trainers = [p for p in report["swarm"]["peers"] if p["name"].startswith("trainer")]
    assert trainers and all(p["finished"] and p["reason"] == "signal" for p in trainers)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_with_a_lying_reducer_says_who_caught_it(tmp_path):
    """``--attacker lying_reducer``: one admitted trainer returns its part shifted;
    every honest trainer's check fails, the dispute proves the lie, they ban it,
    and the summary says so, with the honest loss against one peer alone."""
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "p2pdl", "demo", "--duration", "30", "--attacker",
         "lying_reducer", "--out", str(out)],
        capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["attacker"] == "lying_reducer"
    attack = report["attack"]
    assert attack["kind"] == "lying_reducer"
    assert attack["peer_id"] == report["membership"]["members"]["attacker"]
    trainers = [m for m in attack["members"] if m["member"].startswith("trainer-")]
    assert len(trainers) == 3
    caught = [m for m in trainers if m["flags"].get("reducer_lie")]
    assert len(caught) >= 2, attack   # a trainer may miss every round with it under load
    assert all(m["banned"] and m["first_flag_s"] is not None for m in caught), attack
    assert attack["flagged_by"] >= len(caught) and attack["banned_by"] >= len(caught)
    assert attack["honest_val_loss_end"] < report["swarm"]["val_loss_start"]
    assert attack["honest_over_alone"] is not None
    line = re.search(r"attacker 12D3\S+ \(lying_reducer\): flagged by (\d)/(\d) members "
                     r"\([^)]*reducer_lie", result.stdout)
    assert line, result.stdout[-3000:]
    assert "honest held-out loss" in result.stdout
    roles = {p["name"] for p in report["swarm"]["peers"]}
    assert "attacker" in roles and {"trainer-0", "trainer-1", "trainer-2"} <= roles
