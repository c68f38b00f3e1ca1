"""The README's runnable example stays true."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_trio_quick_start_runs(capsys):
    block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
                 if "trio.run(main)" in b)
    exec(compile(block, "README.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Sum(value=5)"
    assert 0 < float(out[1]) < 5


def test_ci_runs_the_readme_test_command():
    text = README.read_text()
    assert "<!-- main-command -->" in text and "<!-- test-command -->" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci
