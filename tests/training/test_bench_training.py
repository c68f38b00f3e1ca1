"""simulations/bench_training.py keeps working: a tiny run in the emulated internet
(root, ip/tc/nft), and its guard and argument checks."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from p2pdl import netlab

BENCH = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "bench_training.py"


def _lab_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("bench_training needs root (network namespaces)")
    ok, reason = netlab.available()
    if not ok:
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_training_prints_its_json():
    _lab_or_skip()
    # The example's small model, a 64-sample global batch, one measured epoch:
    # about 25 s on an idle 2-core machine.
    done = subprocess.run([sys.executable, str(BENCH), "--model", "tiny", "--scale", "0.0625",
                           "--duration", "2", "--epochs", "1", "--no-delayed", "--json-only",
                           "--timeout", "180"],
                          capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    for key in ("swarm_samples_s", "solo_samples_s_sum", "efficiency", "efficiency_vs_fwd_bwd",
                "peers", "link_mbit_s", "epochs", "target_batch_size", "model_parameters",
                "rounds_by_outcome", "round_s_mean", "averaging_fraction_of_wall", "plan",
                "solo", "swarm", "warnings", "wall_s"):
        assert key in report, key
    assert "error" not in report, report.get("error")
    assert report["peers"] == 2 and report["link_mbit_s"] == 100
    assert report["train_mode"] == "dedloc"
    assert report["target_batch_size"] == 64 and report["epochs"] == 1
    assert report["efficiency"] > 0 and report["swarm_samples_s"] > 0
    assert report["solo_samples_s_sum"] > 0
    assert report["efficiency"] == pytest.approx(
        report["swarm_samples_s"] / report["solo_samples_s_sum"], rel=1e-3)
    assert "efficiency_delayed" not in report
    assert [p["affinity"] for p in report["solo"]["per_peer"]] == [[0], [1]]
    swarm = report["swarm"]
    assert swarm["samples"] >= report["target_batch_size"]  # one epoch at least
    assert sum(swarm["rounds_by_outcome"].values()) == 2  # each peer ended one epoch
    assert len(swarm["per_peer"]) == 2
    # its namespaces are gone
    assert report["netlab_run"] and report["netlab_run"] not in netlab.runs_present()


def test_bench_training_refuses_bad_arguments():
    done = subprocess.run([sys.executable, str(BENCH), "--epochs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "must be positive" in done.stderr


def test_bench_training_without_the_lab_prints_a_json_error():
    if os.geteuid() == 0 and netlab.available()[0]:
        # Run it as if unprivileged: the guard must refuse before touching anything.
        code = ("import os, runpy, sys; os.geteuid = lambda: 1000; "
                f"sys.argv = [{str(BENCH)!r}]; runpy.run_path({str(BENCH)!r}, "
                "run_name='__main__')")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60)
    else:
        done = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["efficiency"] is None and "error" in report
