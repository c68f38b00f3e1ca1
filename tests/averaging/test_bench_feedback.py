"""simulations/bench_feedback.py runs at a tiny size and says what it measures:
every codec with and without error feedback, the rounding of the sum smaller with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "simulations" / "bench_feedback.py"


@pytest.mark.timeout(120)
def test_every_codec_with_and_without_feedback_at_a_tiny_size():
    out = subprocess.run([sys.executable, str(BENCH), "--numel", "20000", "--rounds", "20"],
                         capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    rows = {(r["codec"], r["feedback"]): r for r in report["rows"]}
    assert set(rows) == {(c, f) for c in ("none", "fp16", "uint8", "uint4", "topk", "qtopk")
                         for f in (False, True)}
    assert rows["none", False]["sum_error"] < 1e-6
    assert rows["uint4", False]["bytes_per_value"] == pytest.approx(0.531, abs=1e-3)
    assert rows["topk", False]["bytes_per_value"] == pytest.approx(0.125, abs=0.002)
    assert rows["topk", False]["result_bytes_per_value"] == pytest.approx(0.5, abs=0.01)
    assert rows["qtopk", False]["bytes_per_value"] == pytest.approx(0.0547, abs=0.002)
    assert rows["qtopk", False]["result_bytes_per_value"] == pytest.approx(0.375, abs=0.01)
    for codec in ("uint8", "uint4", "topk", "qtopk"):
        assert rows[codec, True]["sum_error"] < rows[codec, False]["sum_error"], codec
    bad = subprocess.run([sys.executable, str(BENCH), "--rounds", "0"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "at least 1" in bad.stderr
