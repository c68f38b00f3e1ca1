"""simulations/bench_netlab.py runs at a tiny size and measures every case (as root)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2pdl import netlab

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "simulations" / "bench_netlab.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_one_rate_at_a_tiny_size():
    ok, reason = netlab.available()
    if not ok:
        pytest.skip(reason)
    out = subprocess.run([sys.executable, str(BENCH), "--rates", "50", "--seconds", "0.5",
                          "--repeats", "1"], capture_output=True, text=True, timeout=100,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["uncapped_mbit"] > 0
    assert len(result["results"]) >= 2
    for row in result["results"]:
        assert row["cap_mbit"] == 50.0 and len(row["measured_mbit"]) == 1, row
        assert 0 < row["median_mbit"] and 0.5 < row["ratio"] < 1.2, row
