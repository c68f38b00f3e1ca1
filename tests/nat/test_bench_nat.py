"""simulations/bench_nat.py runs at a tiny size in the emulated internet and
measures every key, each path labelled as the bench asserts (as root)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2pdl import netlab

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "simulations" / "bench_nat.py"
MEASURED = ("direct_mbit_s", "relayed_mbit_s", "holepunched_mbit_s", "raw_tcp_mbit_s",
            "relay_setup_s", "holepunch_setup_s")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]


def test_every_path_at_a_tiny_size():
    ok, reason = netlab.available()
    if not ok:
        pytest.skip(reason)
    out = subprocess.run([sys.executable, str(BENCH), "--mib", "2", "--cap", "200"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    for key in MEASURED:
        assert isinstance(result[key], float) and result[key] > 0, (key, result)
    assert result["mib_per_case"] == 2
