"""simulations/bench_efficiency.py keeps working: a short run of one mode in the
emulated internet (root, ip/tc/nft), and its argument checks."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from p2pdl import netlab

BENCH = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "bench_efficiency.py"


def test_bench_efficiency_refuses_unknown_modes_in_one_line():
    done = subprocess.run([sys.executable, str(BENCH), "--modes", "diloco,warp"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "--modes: unknown warp; known: solo, dedloc_fp16, diloco, diloco_int4, diloco_topk, "
        "diloco_overlapped, hivemind, hivemind_local"]


def _row(mode: str, system: str, reached: float | None, last: float,
         bytes_per_peer: int = 1000) -> dict:
    return {"mode": mode, "system": system, "reached": reached is not None,
            "time_to_loss_s": reached, "seconds": last + 1, "bytes_per_peer": bytes_per_peer,
            "evals": [[0.0, 5.0], [last, 2.4 if reached else 3.0]],
            "round_s_median": None}


def _summary(rows: list[dict]) -> dict:
    sys.path.insert(0, str(BENCH.parents[1]))
    try:
        from simulations.bench_efficiency import summarize
    finally:
        sys.path.remove(str(BENCH.parents[1]))
    out = {"rows": rows, "notes": []}
    summarize(out)
    return out


def test_hivemind_is_compared_with_p2pdls_fastest_mode_only():
    out = _summary([_row("solo", "p2pdl", 5.0, 5.0), _row("diloco", "p2pdl", 20.0, 20.0),
                    _row("diloco_int4", "p2pdl", 16.0, 16.0),
                    _row("hivemind", "hivemind", None, 300.0),
                    _row("hivemind_local", "hivemind", 64.0, 64.0)])
    # solo is not a swarm mode, and hivemind's rows are not p2pdl's
    assert out["best_time_mode"] == "diloco_int4"
    assert out["hivemind_best_mode"] == "hivemind_local"
    assert out["best_vs_hivemind_time"] == 4.0
    assert "best_vs_hivemind_time_at_least" not in out


def test_a_hivemind_that_never_reached_the_loss_gives_a_lower_bound():
    out = _summary([_row("diloco", "p2pdl", 20.0, 20.0),
                    _row("hivemind", "hivemind", None, 300.0),
                    _row("hivemind_local", "hivemind", None, 310.0)])
    assert out.get("best_vs_hivemind_time") is None
    assert out["best_vs_hivemind_time_at_least"] == 15.0   # its last measurement, 300 s
    assert any("lower bound" in note for note in out["notes"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_efficiency_prints_its_json():
    if os.geteuid() != 0:
        pytest.skip("bench_efficiency needs root (network namespaces)")
    ok, reason = netlab.available()
    if not ok:
        pytest.skip(reason)
    # One DiLoCo mode with uint4 deltas to a loss the example passes in seconds.
    done = subprocess.run([sys.executable, str(BENCH), "--modes", "diloco_int4",
                           "--target-loss", "4.0", "--max-seconds", "60",
                           "--diloco-target", "256", "--eval-every", "2",
                           "--eval-batches", "2", "--no-caps-check", "--json-only",
                           "--timeout", "240"],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    assert "error" not in report, report.get("error")
    for key in ("rows", "best_vs_hivemind_time", "bytes_vs_dedloc_fp16",
                "measured_plan_vs_true_caps", "links_mbit", "notes", "wall_s"):
        assert key in report, key
    [row] = report["rows"]
    for key in ("mode", "time_to_loss_s", "bytes_per_peer", "final_loss"):
        assert key in row, key
    assert row["mode"] == "diloco_int4" and row["codec"] == "uint4"
    assert row["reached"] and row["final_loss"] <= 4.0
    assert 0 <= row["time_to_loss_s"] <= 60
    # every peer's link carried the DHT, matchmaking and at least a round
    assert min(row["bytes_sent_per_peer"]) > 0 and row["bytes_per_peer"] > 0
    assert report["links_mbit"] == [20.0, 10.0, 10.0, 5.0]
    # its namespaces are gone
    assert report["netlab_run"] and report["netlab_run"] not in netlab.runs_present()
