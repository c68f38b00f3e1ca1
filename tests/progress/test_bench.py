"""simulations/bench_progress.py keeps working (a small run), and its fill-time rule."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "bench_progress.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_progress", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fill_time_is_when_the_sum_of_latest_counts_reaches_the_target():
    bench = load_bench()
    steps = [[0, 0, 32, 1.0], [1, 0, 32, 1.5], [0, 0, 64, 2.0], [1, 0, 64, 2.2],
             [0, 1, 32, 3.0]]  # (peer, epoch, samples, time)
    assert bench.fill_times(steps, 96) == {0: 2.0}
    assert bench.fill_times(steps, 128) == {0: 2.2}
    assert bench.fill_times(steps, 1000) == {}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_progress_prints_its_json():
    done = subprocess.run([sys.executable, str(BENCH), "--peers", "4", "--processes", "2",
                           "--epochs", "2", "--target", "768", "--settle", "0"],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["peers"] == 4
    for mode in ("gossip", "poll"):
        assert report[f"{mode}_epochs"] == 2, report
        assert report[f"{mode}_ready_events"] == 8, report
        assert report[f"{mode}_ready_p50_s"] >= 0
        assert report[f"{mode}_bytes_per_peer_min"] > 0
    assert report["gossip_vs_poll_bytes"] > 0


def test_bench_progress_refuses_bad_arguments():
    done = subprocess.run([sys.executable, str(BENCH), "--peers", "7", "--processes", "2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "multiple of --processes" in done.stderr
