"""docs/progress.md stays true: its first example runs, every other snippet compiles."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "progress.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.mark.timeout(120)
def test_the_first_example_runs_on_loopback(capsys):
    block = python_blocks()[0]
    exec(compile(block, "docs/progress.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.splitlines() == ["700 False", "1000 3", "1 0"]


def test_every_other_snippet_compiles():
    blocks = python_blocks()
    assert len(blocks) >= 2, "the guide lost its examples"
    for number, block in enumerate(blocks[1:], start=2):
        compile(block, f"docs/progress.md, python block {number}", "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
