"""simulations/bench_monitor.py keeps working (a small run) and prints its keys."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "bench_monitor.py"
KEYS = {"monitor_cpu_fraction", "monitor_rss_mib", "db_bytes_per_1000_epochs_100_peers",
        "page_bytes", "first_render_ms"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_monitor_prints_its_json():
    done = subprocess.run([sys.executable, str(BENCH), "--peers", "12", "--duration", "9",
                           "--warmup", "2", "--epoch-seconds", "2"],
                          capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert KEYS <= report.keys()
    assert report["push_failures"] == 0 and report["peers_in_view"] == 12
    assert report["epochs_credited"] >= 2 and report["credits"] >= 24
    assert 0 < report["monitor_cpu_fraction"] < 1 and report["monitor_rss_mib"] > 10
    assert report["page_bytes"] > 1000 and report["db_bytes_per_1000_epochs_100_peers"] > 10**6
    if shutil.which("chromium") or os.environ.get("CI"):
        assert report["first_render_ms"] is not None and report["first_render_ms"] > 0
