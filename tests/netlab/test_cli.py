"""``python -m p2pdl.netlab``: check, up (stopped by a signal), list, cleanup."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from p2pdl import netlab
from p2pdl.netlab.cli import main

from .conftest import lab_names, read_line

COMMAND = [sys.executable, "-m", "p2pdl.netlab"]


def test_check_reports_each_facility(lab_required: None, capsys: pytest.CaptureFixture):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "nftables NAT (symmetric)" in out and "tbf and ifb" in out
    assert re.search(r"netem .*no .*bandwidth and NAT only", out)
    assert out.rstrip().endswith("netlab can run here")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_up_builds_the_sample_internet_until_a_signal(lab_required: None, signum: int):
    proc = subprocess.Popen([*COMMAND, "up", "--rate-mbit", "50"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = [read_line(proc, timeout=30)]
        while not lines[-1].startswith("Ctrl-C removes everything"):
            lines.append(read_line(proc, timeout=30))
        run_id = re.match(r"run ([0-9a-f]{4}):", lines[0]).group(1)
        names = lab_names(run_id)
        assert names == sorted(f"p2nl-{run_id}{s}" for s in ("", "-relay", "-nat1", "-a",
                                                              "-nat2", "-b"))
        text = "\n".join(lines)
        assert "NAT endpoint-independent" in text and "NAT symmetric" in text
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "stopped; the lab is removed" in out and "Traceback" not in err
    assert lab_names(run_id) == []


def test_up_with_a_duration_and_list_and_cleanup(lab_required: None,
                                                 capsys: pytest.CaptureFixture):
    assert main(["up", "--duration", "0.1"]) == 0
    run_id = re.match(r"run ([0-9a-f]{4}):", capsys.readouterr().out).group(1)
    assert run_id not in netlab.runs_present()
    with netlab.Internet() as net:
        assert main(["list"]) == 0
        out = capsys.readouterr().out
        assert re.search(rf"{net.run_id}  owner pid \d+ running  1 namespaces: {net.netns}", out)
        assert main(["cleanup", "--run", net.run_id]) == 0
        assert capsys.readouterr().out == f"removed 1 namespaces: {net.netns}\n"


def test_errors_are_one_line(capsys: pytest.CaptureFixture):
    assert main(["cleanup", "--run", "nope"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m p2pdl.netlab: error: invalid run id 'nope': four lower-case hex digits expected")
    with pytest.raises(SystemExit) as exc:
        main(["fly"])
    assert exc.value.code == 2
