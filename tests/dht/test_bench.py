"""simulations/bench_dht.py keeps working (a small run, p2pdl only)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "bench_dht.py"


@pytest.mark.timeout(180)
def test_bench_dht_prints_its_json_with_hivemind_skipped():
    done = subprocess.run([sys.executable, str(BENCH), "--nodes", "6", "--processes", "2",
                           "--records", "8", "--settle", "0", "--no-hivemind"],
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["nodes"] == 6 and report["success_rate"] == 1.0
    for key in ("store_p50_ms", "store_p99_ms", "get_p50_ms", "get_p99_ms",
                "get_latest_p50_ms"):
        assert report[key] >= 0, key
    for key in ("hivemind_store_p50_ms", "hivemind_get_p50_ms", "hivemind_success_rate"):
        assert report[key] is None, key
    assert "skipped" in report["note"]


def test_bench_dht_refuses_bad_arguments():
    done = subprocess.run([sys.executable, str(BENCH), "--nodes", "7", "--processes", "2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "multiple of --processes" in done.stderr
