"""simulations/bench_churn.py runs at a tiny size and prints every key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "simulations" / "bench_churn.py"
KEYS = ("loss_ratio_vs_no_churn", "distinct_states_at_end", "join_catch_up_s",
        "joiners_on_own_parameters", "seconds_without_an_averaged_round_after_a_kill",
        "rounds")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_tiny_churn_benchmark_prints_every_key_side_by_side():
    out = subprocess.run([sys.executable, str(BENCH), "--peers", "3", "--churn", "0.5",
                          "--kill-seconds", "8", "--window", "8", "--settle-epochs", "2",
                          "--min-epochs", "4", "--timeout", "300"],
                         capture_output=True, text=True, timeout=380, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    runs = {run["churn"]: run for run in result["runs"]}
    assert sorted(runs) == [0.0, 0.5], result
    for run in runs.values():
        for key in KEYS:
            assert key in run, (key, run)
        assert set(run["rounds"]) == {"averaged", "partial", "alone", "failed"}
        assert run["distinct_states_at_end"] >= 1
    assert runs[0.0]["loss_ratio_vs_no_churn"] == 1.0 and runs[0.0]["kills"] == 0
    assert runs[0.5]["kills"] == 2 and runs[0.5]["loss_ratio_vs_no_churn"] > 0
    assert set(runs[0.5]["join_catch_up_s"]) == {"p50", "max"}
    assert result["common_epoch"] >= 4


def test_bad_arguments_are_one_clear_line():
    out = subprocess.run([sys.executable, str(BENCH), "--churn", "lots"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "--churn takes comma-separated fractions" in out.stderr
    assert "Traceback" not in out.stderr
