"""docs/examples/: the plain loop and its collaborative version run as documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_the_collaborative_loop_adds_three_lines_to_the_plain_one():
    plain = (EXAMPLES / "plain_loop.py").read_text().split('"""')[2].splitlines()
    collaborative = (EXAMPLES / "collaborative_loop.py").read_text().split('"""')[2].splitlines()
    added = [line for line in collaborative if line not in plain]
    assert [line for line in plain if line not in collaborative] == []
    assert len(added) == 3 and all(line.endswith("# p2pdl") for line in added)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_collaborative_peers_train_together():
    first = subprocess.Popen([sys.executable, str(EXAMPLES / "collaborative_loop.py"), "80"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert first.stdout is not None
        line = first.stdout.readline()
        address = next(a for a in line.split()[1:] if a.startswith("/ip4/127.0.0.1/"))
        second = subprocess.run([sys.executable, str(EXAMPLES / "collaborative_loop.py"), "80",
                                 address], capture_output=True, text=True, env=ENV, timeout=200)
        rest, errors = first.communicate(timeout=200)
    finally:
        first.kill()
        first.wait(10)
    assert second.returncode == 0, second.stderr[-2000:]
    assert first.returncode == 0, errors[-2000:]
    for output in (line + rest, second.stdout):
        held_out = float(re.findall(r"held-out loss: (\d+\.\d+)", output)[0])
        assert held_out < 4.8, output  # the untrained model: about 5.5
    assert "Traceback" not in second.stderr + errors


def test_the_plain_loop_runs():
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(EXAMPLES / "plain_loop.py"), "3"],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "held-out loss" in out.stdout and time.monotonic() - start < 120
