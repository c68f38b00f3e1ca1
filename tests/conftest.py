"""Shared fixtures: real nodes on loopback only."""

from __future__ import annotations

import pytest

from p2pdl.testing import open_nodes


@pytest.fixture
async def two_nodes():
    async with open_nodes(2) as nodes:
        yield nodes


@pytest.fixture
async def three_nodes():
    async with open_nodes(3) as nodes:
        yield nodes
