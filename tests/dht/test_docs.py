"""docs/dht.md stays true: its first example runs, every other snippet compiles."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "dht.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.mark.timeout(120)
def test_the_first_example_runs_on_loopback(capsys):
    block = python_blocks()[0]
    exec(compile(block, "docs/dht.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out.splitlines()
    assert out == ["True", "{'lr': 0.001}", "[320, 640]", "True"]


def test_every_other_snippet_compiles():
    # Snippets show fragments of async code (`await node.dht.get(...)` outside a
    # function), so top-level await is allowed; everything else must be valid Python.
    blocks = python_blocks()
    assert len(blocks) >= 8, "the guide lost its examples"
    for number, block in enumerate(blocks[1:], start=2):
        compile(block, f"docs/dht.md, python block {number}", "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
