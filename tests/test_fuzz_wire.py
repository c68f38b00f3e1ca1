"""A short run of the wire fuzzer (``simulations/fuzz_wire.py``): strangers attack a
real node over real connections, in three processes on loopback."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = 4  # per protocol and input class


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_short_fuzzing_run_leaves_the_node_alive_and_its_peers_served():
    done = subprocess.run(
        [sys.executable, str(ROOT / "simulations" / "fuzz_wire.py"), "--cases", str(CASES),
         "--baseline", "1", "--settle", "2", "--timeout", "120"],
        cwd=ROOT, capture_output=True, text=True, timeout=140)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["node_alive"], report
    assert report["honest_failures"] == 0, report["honest"]
    assert report["log"]["tracebacks"] == 0, report["log"]
    assert report["log"]["error_lines"] == 0, report["log"]
    assert report["ok"], report
    protocols = report["cases"]
    assert len(protocols) == 15
    for name, classes in protocols.items():
        assert set(classes) == {"random", "bad_length", "huge_length", "wrong_shape",
                                "truncation", "idle", "flood"}, name
        assert all(n >= CASES - 1 for n in classes.values()), (name, classes)
    for kind in ("ping", "dht"):
        for phase in ("before", "during", "after"):
            assert report["honest"][kind][phase]["requests"] > 0, (kind, phase)
