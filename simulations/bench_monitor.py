"""What a monitor costs: 100 reporters, real signed reports over loopback.

    python simulations/bench_monitor.py [--peers 100] [--duration 60] [--warmup 10]
                                        [--report-interval 1] [--epoch-seconds 3]

A real ``p2pdl monitor`` process (``--http``: its dashboard and metrics
served; ``--view lines``) follows an open run.  This process plays
``--peers`` trainers: each has its own ed25519 key and signs its own
progress report (epoch, a growing sample count, its rate, a display name, a
loss, a path and, from epoch 1 on, its last round: averaged, its part having
taken every other reporter's values, 64 named at most) every
``--report-interval`` seconds; one node on loopback
pushes them to the monitor on the progress protocol (``progress.push``, 64
reports a message at most), as a member forwarding others' signed reports
does.  Every ``--epoch-seconds`` all of them move to the next epoch, so the
monitor credits ``--peers`` peers every epoch.

Prints one JSON object:

* ``monitor_cpu_fraction`` -- the monitor process's CPU time (user + system,
  from ``/proc``) over the wall time of the run after ``--warmup``: a
  fraction of one core (goal <= 0.10);
* ``monitor_rss_mib``, ``monitor_peak_rss_mib`` -- its resident memory at
  the end, and its peak (``VmHWM``);
* ``db_bytes_per_1000_epochs_100_peers`` -- the credit database's size on
  disk after 1,000 epochs of 100 peers' credits written as the monitor
  writes them (one transaction per epoch, then a WAL checkpoint), with their
  names;
* ``live_db_bytes_per_epoch`` -- the monitor's own database over the epochs
  it credited in this run (its WAL included);
* ``page_bytes`` -- the dashboard's page and script as served;
* ``first_render_ms`` -- headless Chromium (Debian's ``chromium``) opening
  the dashboard: the page's own ``performance.now()`` when it first drew
  the run's data (navigation, the page, its script, ``/api/state``, the
  drawing), read over the DevTools protocol (``--remote-debugging-pipe``);
  null without Chromium;
* ``peers_in_view``, ``epochs_credited``, ``credits`` -- what the monitor
  saw, from its ``/api/state`` and database: a check that the load arrived.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libp2p.crypto.ed25519 import create_new_key_pair  # noqa: E402
from libp2p.peer.id import ID  # noqa: E402

from p2pdl import NodeConfig, open_node  # noqa: E402
from p2pdl.monitor import Credit, CreditStore  # noqa: E402
from p2pdl.progress import PROGRESS_PROTOCOL, ReportInfo, round_tags, sign_report  # noqa: E402
from p2pdl.progress._messages import Push  # noqa: E402

RUN = "bench-monitor"
#: Reports in one push (the protocol's MAX_REPORTS is 64).
BATCH = 50
#: Each simulated trainer's samples per second.
RATE = 40.0
PATHS = ("direct", "hole-punched", "relayed")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process ``pid`` in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {key: int(value.split()[0]) for key, value in re.findall(r"^(Vm\w+):\s+(.*)$",
                                                                   status, re.M)}
    return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024


def db_bytes_per_1000_epochs(peers: int = 100, epochs: int = 1000) -> int:
    """The credit database's bytes on disk after ``epochs`` epochs of ``peers`` credits."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "credits.sqlite"
        names = [f"12D3KooW{i:044d}" for i in range(peers)]
        with CreditStore(path) as store:
            store.set_names(RUN, {peer: f"volunteer-{i}" for i, peer in enumerate(names)}, 0.0)
            for epoch in range(epochs):
                store.add(Credit(RUN, peer, epoch, 256, 1.7e9 + epoch) for peer in names)
        db = sqlite3.connect(path)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
        return sum(p.stat().st_size for p in Path(tmp).iterdir())


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read()


class Chromium:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (the DevTools
    protocol: JSON messages ending in NUL on fds 3 and 4 of the browser)."""

    def __init__(self, profile: Path) -> None:
        executable = shutil.which("chromium") or shutil.which("chromium-browser")
        if executable is None:
            raise FileNotFoundError("chromium")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:   # the browser reads fd 3 and writes fd 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-pipe"],
            preexec_fn=fds, pass_fds=(3, 4),   # kept open past the exec (after fds())
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._ids = itertools.count(1)
        self._buffer = b""

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Send one command; return its result (events in between are dropped)."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == ident:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
        raise TimeoutError(method)

    def first_render_ms(self, url: str, timeout: float = 30.0) -> float:
        """Open ``url`` in a fresh tab; the page's ``data-first-render-ms``."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.send("Runtime.evaluate", {
                "expression": "document.documentElement.dataset.firstRenderMs || null",
                "returnByValue": True}, session=session)["result"].get("value")
            if value:
                return float(value)
            time.sleep(0.02)
        raise TimeoutError("the dashboard did not render")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:   # it may be gone already
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self._to_browser)
        os.close(self._from_browser)


def start_monitor(tmp: Path) -> tuple[subprocess.Popen[str], str, str]:
    """A ``p2pdl monitor`` process; its first address and its dashboard URL."""
    monitor = subprocess.Popen(
        [sys.executable, "-m", "p2pdl", "monitor", "--run-id", RUN, "--listen",
         "/ip4/127.0.0.1/tcp/0", "--db", str(tmp / "credits.sqlite"), "--http", "127.0.0.1:0",
         "--view", "lines", "--status-interval", "3600", "--target-batch-size", "1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    address = dashboard = None
    deadline = time.monotonic() + 60
    assert monitor.stdout is not None
    while (address is None or dashboard is None) and time.monotonic() < deadline:
        line = monitor.stdout.readline()
        if not line:
            raise RuntimeError(f"the monitor exited: {monitor.stderr.read()[-2000:]}")
        if line.startswith("/ip4/127.0.0.1/") and address is None:
            address = line.strip()
        elif line.startswith("dashboard: "):
            dashboard = line.split(" ", 1)[1].strip()
    if address is None or dashboard is None:
        raise RuntimeError("the monitor did not print its address and dashboard")
    return monitor, address, dashboard


async def report(args: argparse.Namespace, address: str, dashboard: str,
                 monitor_pid: int) -> dict[str, Any]:
    """Play the reporters for ``--duration`` s; measure the monitor's CPU after ``--warmup``."""
    keys = [create_new_key_pair() for _ in range(args.peers)]
    ids = [ID.from_pubkey(k.public_key) for k in keys]
    tags = [round_tags(p.to_bytes(), [q.to_bytes() for q in ids]) for p in ids]
    config = NodeConfig.build(listen=["/ip4/127.0.0.1/tcp/0"], initial_peers=[address])
    monitor_id = ID.from_base58(address.rsplit("/p2p/", 1)[1])
    measured: dict[str, float] = {}
    async with open_node(config) as node:
        start = time.time()
        epoch_start = start
        epoch = 0
        pushes = failures = 0
        while time.time() - start < args.duration:
            now = time.time()
            if now - epoch_start >= args.epoch_seconds:
                epoch, epoch_start = epoch + 1, now
            if "cpu0" not in measured and now - start >= args.warmup:
                measured["cpu0"], measured["wall0"] = proc_cpu_seconds(monitor_pid), now
            samples = int(RATE * (now - epoch_start)) + 1
            # from epoch 1 on, each says its part of the last round took the others'
            rounds = [(epoch - 1, "averaged", len(ids), tags[i]) if epoch else (None,) * 4
                      for i in range(len(ids))]
            reports = [sign_report(k.private_key, peer, RUN, epoch, samples, RATE, now, False,
                                   credential=None,
                                   info=ReportInfo(f"volunteer-{i}", 3.0 - epoch / 100,
                                                   PATHS[i % 3], *rounds[i]))
                       for i, (k, peer) in enumerate(zip(keys, ids, strict=True))]
            for lo in range(0, len(reports), BATCH):
                try:
                    await node.call(monitor_id, PROGRESS_PROTOCOL,
                                    Push(RUN, tuple(reports[lo:lo + BATCH])))
                    pushes += 1
                except Exception as exc:   # counted: the run goes on
                    failures += 1
                    print(f"bench: a push failed: {exc}", file=sys.stderr)
            await trio.sleep(max(0.0, args.report_interval - (time.time() - now)))
        end = time.time()
        cpu = proc_cpu_seconds(monitor_pid) - measured["cpu0"]
        # What the dashboard shows while the reports still come.
        state = json.loads(await trio.to_thread.run_sync(fetch, dashboard + "api/state"))
    return {"monitor_cpu_fraction": round(cpu / (end - measured["wall0"]), 4),
            "peers_in_view": len(state["peers"]),
            "measured_s": round(end - measured["wall0"], 1), "epochs_reported": epoch + 1,
            "pushes": pushes, "push_failures": failures}


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        monitor, address, dashboard = start_monitor(tmp)
        try:
            print(f"bench: monitor at {address}, dashboard {dashboard}", file=sys.stderr)
            out = trio.run(report, args, address, dashboard, monitor.pid)
            rss, peak = proc_memory_mib(monitor.pid)
            out["monitor_rss_mib"], out["monitor_peak_rss_mib"] = round(rss, 1), round(peak, 1)
            page = fetch(dashboard) + fetch(dashboard + "dashboard.js")
            out["page_bytes"] = len(page)
            try:
                browser = Chromium(tmp / "profile")
            except FileNotFoundError:
                out["first_render_ms"] = None
                print("bench: no chromium: first_render_ms is null", file=sys.stderr)
            else:
                try:
                    renders = [browser.first_render_ms(dashboard) for _ in range(3)]
                    out["first_render_ms"] = round(sorted(renders)[1], 1)   # the median
                    out["first_render_ms_all"] = [round(r, 1) for r in renders]
                finally:
                    browser.close()
        finally:
            monitor.terminate()
            try:
                monitor.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                monitor.kill()
        db = sqlite3.connect(tmp / "credits.sqlite")
        epochs, credits = db.execute(
            "SELECT COUNT(DISTINCT epoch), COUNT(*) FROM credits").fetchone()
        db.close()
        size = sum(p.stat().st_size for p in tmp.iterdir() if p.name.startswith("credits."))
    out.update({"epochs_credited": epochs, "credits": credits,
                "live_db_bytes_per_epoch": round(size / epochs) if epochs else None,
                "db_bytes_per_1000_epochs_100_peers": db_bytes_per_1000_epochs(),
                "peers": args.peers, "duration_s": args.duration,
                "report_interval_s": args.report_interval, "epoch_seconds": args.epoch_seconds})
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=100)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--report-interval", type=float, default=1.0)
    parser.add_argument("--epoch-seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if not 0 < args.warmup < args.duration:
        parser.error("--warmup must be within --duration")
    return args


if __name__ == "__main__":
    print(json.dumps(main(parse_args())))
