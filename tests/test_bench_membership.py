"""simulations/bench_membership.py runs at a tiny size and prints every key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "simulations" / "bench_membership.py"
KEYS = ("handshake_ms_p50", "handshake_ms_p99", "round_overhead_fraction",
        "honest_loss_ratio")


def bench(*args: str, timeout: float) -> dict:
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.timeout(120)
def test_the_handshake_part_times_one_introduction_per_fresh_connection():
    result = bench("--handshakes", "5", "--skip", "rounds,loss", timeout=100)
    assert not result["notes"], result["notes"]
    assert set(KEYS) <= set(result)
    assert 0 < result["handshake_ms_p50"] <= result["handshake_ms_p99"]
    assert result["connect_ms_p50"] > 0 and result["handshakes"] == 5
    assert result["round_overhead_fraction"] is None and result["honest_loss_ratio"] is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_part_at_a_tiny_size():
    result = bench("--handshakes", "5", "--rounds", "2", "--numel", "100000", "--epochs", "2",
                   timeout=280)
    assert not result["notes"], result["notes"]
    assert all(isinstance(result[k], float) for k in KEYS), result
    assert len(result["open_round_s"]) == len(result["closed_round_s"]) == 2
    assert result["round_errors"] == [] and result["peers"] == 4
    assert result["handshakes_sent_per_peer"] == [3, 3, 3, 3]
    assert result["honest_run_identical"] and result["epochs"] == 2
    assert result["flags_seen"]["liar"].get("epoch_ahead"), result["flags_seen"]
    # both attacks reached the honest peers: the ratio measured an attack
    assert result["unmounted"] == [], result["attack_rounds"]
    assert result["attack_rounds"]["inflater"] and result["attack_rounds"]["liar"], result
