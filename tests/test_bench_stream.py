"""simulations/bench_stream.py runs at a tiny size and measures every key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "simulations" / "bench_stream.py"
MEASURED = ("p2pdl_mib_s", "p2pdl_8streams_mib_s", "libp2p_mib_s", "raw_tcp_mib_s",
            "ratio_vs_libp2p", "rtt_p50_ms", "rtt_p99_ms", "libp2p_rtt_p50_ms", "cpu_s_per_gib")


@pytest.mark.timeout(150)
def test_every_case_at_a_tiny_size():
    out = subprocess.run([sys.executable, str(BENCH), "--mib", "8", "--repeats", "1",
                          "--calls", "50"], capture_output=True, text=True, timeout=130, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    for key in MEASURED:
        assert isinstance(result[key], float) and result[key] > 0, (key, result)
    assert result["mib_per_case"] == 8 and result["repeats"] == 1
    assert all(len(v) == 1 for v in result["samples"].values()), result["samples"]
