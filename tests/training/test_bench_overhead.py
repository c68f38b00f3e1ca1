"""simulations/bench_overhead.py keeps working: a quick run prints its JSON."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "bench_overhead.py"


@pytest.mark.timeout(240)
def test_bench_overhead_prints_its_json():
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True,
                          text=True, timeout=220)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    for key in ("step_overhead_ms", "step_overhead_fraction", "extra_memory_parameter_copies",
                "diloco_step_overhead_ms", "diloco_step_overhead_fraction",
                "diloco_extra_memory_parameter_copies", "plain_step_ms", "dedloc_step_ms",
                "loop_peak_rss_mb", "parameters", "memory_parameters", "cuda", "goals"):
        assert key in report, key
    assert report["steps_per_arm"] == 4 and report["plain_step_ms"] > 0
    # Each p2pdl arm holds at least its own copies: the accumulators (DeDLOC),
    # the anchor and the outer momentum (DiLoCo); the tiny model's are small,
    # so only the order is checked.
    peaks = report["loop_peak_rss_mb"]
    assert peaks["diloco"] >= peaks["dedloc"] > 0


@pytest.mark.timeout(60)
def test_bench_overhead_refuses_bad_arguments():
    done = subprocess.run([sys.executable, str(BENCH), "--blocks", "0"], capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 2 and "--blocks must be >= 1" in done.stderr
