"""The package surface, its import boundary, and clear errors where the lab cannot run."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from p2pdl import netlab
from p2pdl.netlab import _probe, _topology

PACKAGE = pathlib.Path(netlab.__file__).parent


def test_public_names_are_re_exports_of_private_modules():
    public = [n for n in dir(netlab) if not n.startswith("_")]
    for name in public:
        obj = getattr(netlab, name)
        module = getattr(obj, "__module__", None)
        if module is not None and not isinstance(obj, str):
            assert module.startswith("p2pdl.netlab._"), (name, module)
    assert {"Internet", "NatType", "Host", "NatGateway", "Rate", "cleanup", "available",
            "check", "require", "measure_throughput", "NetlabError",
            "NetlabUnavailable"} <= set(public)


def test_imports_nothing_of_p2pdl_but_its_errors():
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                assert node.module == "errors", f"{path.name} imports ..{node.module}"
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith("p2pdl"), path.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("p2pdl") for a in node.names), path.name


def test_not_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_topology.os, "geteuid", lambda: 1000)
    with pytest.raises(netlab.NetlabUnavailable, match="must run as root .*uid 1000"):
        netlab.Internet()
    report = netlab.check()
    assert len(report) == 1 and not report[0].ok and "must run as root" in report[0].detail
    ok, reason = _probe._verdict(report)
    assert not ok and reason.startswith("netlab cannot run here: root and ip/tc/nft: must run")


def test_missing_programs_are_named_with_their_packages(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_topology.shutil, "which", lambda name: None if name == "nft" else name)
    with pytest.raises(netlab.NetlabUnavailable, match=r"missing nft \(Debian packages: "
                                                        r"nftables\)"):
        _topology.preflight()


def test_available_caches_its_verdict(monkeypatch: pytest.MonkeyPatch):
    calls = []
    monkeypatch.setattr(_probe, "check", lambda: calls.append(1) or [_probe.Facility("x", True)])
    try:
        assert netlab.available(refresh=True) == (True, "netlab can run here")
        assert netlab.available() == (True, "netlab can run here")
        assert len(calls) == 1
    finally:
        monkeypatch.undo()
        netlab.available(refresh=True)


def test_help_of_the_command_line():
    result = subprocess.run([sys.executable, "-m", "p2pdl.netlab", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps to the terminal's width
    for command in ("check", "up", "list", "cleanup"):
        assert command in text
    assert "this kernel has no netem" in text
