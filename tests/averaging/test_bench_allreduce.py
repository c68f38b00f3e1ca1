"""simulations/bench_allreduce.py runs at a tiny size: p2pdl and gloo, every row measured
and correct (hivemind is left out: it is not installed in the test environment)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "simulations" / "bench_allreduce.py"


@pytest.mark.timeout(200)
def test_p2pdl_and_gloo_at_a_tiny_size():
    out = subprocess.run([sys.executable, str(BENCH), "--systems", "p2pdl,gloo", "--peers", "2",
                          "--codecs", "none,fp16", "--rounds", "1", "--numel", "100000",
                          "--timeout", "120"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    assert {(r["system"], r["codec"]) for r in rows} == {
        ("p2pdl", "none"), ("p2pdl", "fp16"), ("gloo", "none"), ("gloo", "fp16")}
    for row in rows:
        assert isinstance(row["median_s"], float) and row["median_s"] > 0, row
        assert row["rounds"] == 1 and row["correct_rounds"] == 1, row
        assert row["max_err"] <= row["tol"], row
        if row["system"] == "p2pdl":   # its workers measure their CPU time
            assert row["cpu_s_median"] > 0 and row["cpu_s_per_gib"] == pytest.approx(
                row["cpu_s_median"] / (2 * 100_000 * 4 / 2**30), rel=0.01), row
        else:
            assert row["cpu_s_median"] is None and row["cpu_s_per_gib"] is None, row
