"""docs/allreduce.md stays true: its first example runs, other snippets compile,
the configuration table matches the defaults."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

import pytest

from p2pdl.averaging import AllReduceConfig

GUIDE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "allreduce.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.mark.timeout(120)
def test_the_first_example_runs_on_loopback(capsys):
    block = python_blocks()[0]
    exec(compile(block, "docs/allreduce.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.splitlines() == ["True", "2.0", "[0, 1, 2]"]


def test_every_other_snippet_compiles():
    blocks = python_blocks()
    assert len(blocks) >= 2, "the guide lost its examples"
    for number, block in enumerate(blocks[1:], start=2):
        compile(block, f"docs/allreduce.md, python block {number}", "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_the_configuration_table_matches_the_defaults():
    text = GUIDE.read_text().split("## Configuration", 1)[1]
    defaults = AllReduceConfig()
    for field in dataclasses.fields(AllReduceConfig):
        row = re.search(rf"^\| `{field.name}` \| ([^|]+) \|", text, re.M)
        assert row, field.name
        if field.name == "verify":
            assert row.group(1).strip() == str(defaults.verify)
        elif field.name not in ("codecs", "aggregator"):
            assert float(re.match(r"[0-9.]+", row.group(1)).group()) == \
                getattr(defaults, field.name), field.name
