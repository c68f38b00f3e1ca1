"""Reference systems for side-by-side benchmarks, each in a virtual environment of its own.

hivemind 1.1.12 (the DeDLOC reference implementation, with its Go daemon)
cannot share p2pdl's environment: it pins other versions of the libraries
p2pdl uses.  :func:`hivemind_python` finds or builds its environment and
returns its interpreter, or None and the reason it cannot be had, so that a
benchmark prints ``null`` and a ``note`` instead of failing.

The environment lives in ``$P2PDL_HIVEMIND_VENV`` (default
``~/.cache/p2pdl/bench/hivemind-1.1.12``) and is built once:
``pip install torch==2.13.0`` first (without it pip picks a multi-GB CUDA
build), then ``pip install hivemind==1.1.12``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HIVEMIND_VERSION = "1.1.12"
TORCH_PIN = "torch==2.13.0"
INSTALL_TIMEOUT = 1800.0  # seconds for the whole build


def hivemind_venv() -> Path:
    default = Path.home() / ".cache" / "p2pdl" / "bench" / f"hivemind-{HIVEMIND_VERSION}"
    return Path(os.environ.get("P2PDL_HIVEMIND_VENV", default))


def _works(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run([str(python), "-c", "import hivemind; print(hivemind.__version__)"],
                           capture_output=True, text=True, timeout=120)
    return probe.returncode == 0 and probe.stdout.strip() == HIVEMIND_VERSION


def hivemind_python(install: bool = True) -> tuple[Path | None, str]:
    """The interpreter of hivemind's environment (built if missing and ``install``),
    or None and why not."""
    venv = hivemind_venv()
    python = venv / "bin" / "python"
    try:
        if _works(python):
            return python, ""
        if not install:
            return None, f"hivemind {HIVEMIND_VERSION} is not installed in {venv}"
        print(f"bench: installing hivemind {HIVEMIND_VERSION} into {venv} (once; minutes)",
              file=sys.stderr)
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", "-q", TORCH_PIN],
                 [str(python), "-m", "pip", "install", "-q", f"hivemind=={HIVEMIND_VERSION}"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                return None, (f"cannot install hivemind {HIVEMIND_VERSION}: "
                              f"{' '.join(step[2:])} failed: {' | '.join(tail)}")
        if _works(python):
            return python, ""
        return None, f"hivemind {HIVEMIND_VERSION} installed in {venv} but does not import"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot install hivemind {HIVEMIND_VERSION}: {exc}"
