"""docs/matchmaking.md stays true: its first example runs, every other snippet compiles."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "matchmaking.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.mark.timeout(120)
def test_the_first_example_runs_on_loopback(capsys):
    block = python_blocks()[0]
    exec(compile(block, "docs/matchmaking.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.splitlines() == ["3", "True", "True"]


def test_every_other_snippet_compiles():
    blocks = python_blocks()
    assert len(blocks) >= 2, "the guide lost its examples"
    for number, block in enumerate(blocks[1:], start=2):
        compile(block, f"docs/matchmaking.md, python block {number}", "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_the_configuration_table_matches_the_defaults():
    import dataclasses

    from p2pdl.averaging import MatchmakingConfig

    text = GUIDE.read_text()
    defaults = MatchmakingConfig()
    for field in dataclasses.fields(MatchmakingConfig):
        value = getattr(defaults, field.name)
        row = re.search(rf"^\| `{field.name}` \| ([0-9.]+)", text, re.M)
        assert row is not None, field.name
        assert float(row.group(1)) == value, field.name
