"""simulations/bench_robust.py runs at a tiny size and prints every key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "simulations" / "bench_robust.py"
ROW_KEYS = {"attack", "malicious", "peers", "aggregator", "loss", "loss_ratio", "diverged",
            "banned", "banned_at_step", "attack_rounds", "mounted", "lied", "detected",
            "false_accusations"}


def bench(*args: str, timeout: float) -> dict:
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.timeout(200)
def test_the_training_part_prints_one_row_per_attack_count_and_rule():
    result = bench("--skip", "round", "--steps", "8", "--batch", "64", "--attacks",
                   "scaled,alie", "--malicious", "1,3", timeout=180)
    rows = result["rows"]
    assert len(rows) == 6 + 2 * 2 * 6
    assert all(ROW_KEYS <= set(row) for row in rows)
    # every attacker's values were taken in some step: each row measured an attack
    assert not [n for n in result["notes"] if "measured nothing" in n], result["notes"]
    assert all(row["mounted"] for row in rows)
    attacked = [r for r in rows if r["malicious"]]
    assert all(len(r["attack_rounds"]) == r["malicious"] and all(r["attack_rounds"])
               for r in attacked)
    # an attacker banned at step k was taken in steps 0..k-1 or k, and never after
    for r in attacked:
        if r["banned"] == r["malicious"]:
            assert all(runs[-1][1] <= r["banned_at_step"] for runs in r["attack_rounds"]), r
        else:
            assert any(runs == [[0, 7]] for runs in r["attack_rounds"]), r
    assert {(r["attack"], r["malicious"], r["aggregator"]) for r in rows} >= {
        ("none", 0, "mean"), ("none", 0, "centered_clip"), ("scaled", 3, "centered_clip"),
        ("alie", 1, "mean"), ("alie", 3, "centered_clip+momentum"),
        ("scaled", 3, "centered_clip_auto"), ("alie", 3, "default")}
    # the defaults are CenteredClip with tau auto and worker momentum: the same runs
    for r in rows:
        if r["aggregator"] == "default":
            twin = next(t for t in rows if t["aggregator"] == "centered_clip_auto+momentum"
                        and (t["attack"], t["malicious"]) == (r["attack"], r["malicious"]))
            assert r["loss"] == twin["loss"], (r, twin)
    baseline = next(r for r in rows if r["attack"] == "none" and r["aggregator"] == "mean")
    assert baseline["loss_ratio"] == 1.0
    # x100 gradients are outliers: banned within the 8 steps under CenteredClip
    scaled = next(r for r in rows if r["attack"] == "scaled" and r["malicious"] == 3
                  and r["aggregator"] == "centered_clip")
    assert scaled["banned"] == 3 and scaled["banned_at_step"] < 8
    # the round part was skipped: its keys are there, null
    assert result["verified_round_time_ratio"] is None
    assert result["verified_round_cpu_ratio"] is None
    assert result["verification_bytes_per_round"] is None
    assert result["false_accusations"] == 0   # no honest reducer's part ever failed
    assert result["lying_reducer_detected_fraction"] is None   # no lying reducer here


@pytest.mark.timeout(200)
def test_an_inflated_claim_buys_half_under_the_mean_and_the_median_under_a_robust_rule():
    result = bench("--skip", "round", "--steps", "8", "--batch", "64", "--attacks", "inflate",
                   "--malicious", "1", timeout=180)
    rows = {(r["attack"], r["aggregator"]): r for r in result["rows"]}
    mean, clip = rows[("inflate", "mean")], rows[("inflate", "centered_clip")]
    assert mean["mounted"] and clip["mounted"]
    # under the mean its flipped gradient holds half the weight and cancels the
    # honest ones: the model barely moves; the median cap holds it to 1 of 8
    assert clip["loss"] < mean["loss"]
    assert mean["loss"] > 0.97 * result["untrained_loss"]


def test_bad_arguments_are_one_line():
    out = subprocess.run([sys.executable, str(BENCH), "--attacks", "krum"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "unknown attacks: krum" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.timeout(200)
def test_a_lying_reducer_is_caught_under_the_default_rule_and_not_under_the_mean():
    result = bench("--skip", "round", "--steps", "6", "--batch", "64", "--attacks",
                   "lying_reducer", "--malicious", "1,3", timeout=180)
    rows = {(r["attack"], r["malicious"], r["aggregator"]): r for r in result["rows"]}
    for malicious in (1, 3):
        default = rows[("lying_reducer", malicious, "default")]
        assert default["lied"] == 6 * malicious and default["detected"] == default["lied"]
        # under the mean a reducer's own term has no bound: it covers its own lie
        assert rows[("lying_reducer", malicious, "mean")]["detected"] == 0
    assert result["lying_reducer_detected_fraction"] == 1.0
    assert result["false_accusations"] == 0


@pytest.mark.timeout(60)
def test_verification_bytes_are_the_nodes_own_count():
    sys.path.insert(0, str(ROOT))
    try:
        from simulations.bench_robust import verification_bytes
    finally:
        sys.path.remove(str(ROOT))
    small, large = verification_bytes(3, 5000), verification_bytes(4, 5000)
    # each member reports ~1 KiB per part it contributed to, to each other member,
    # signed; plus nonces, digests, result signatures and commitments
    assert 3 * 2 * 2 * (1024 + 64) <= small < 3 * 2 * 2 * (1024 + 64) + 6000
    assert large > small
