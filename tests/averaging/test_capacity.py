"""A node's own capacity, measured from its rounds (sans-IO rules, then real rounds)."""

from __future__ import annotations

import math

import pytest
import torch
import trio

from p2pdl.averaging import AllReduceConfig, CapacityEstimate, CapacityEstimator, average_round
from p2pdl.averaging import _capacity as capacity
from p2pdl.averaging._capacity import MIN_SAMPLE_BYTES, MIN_SAMPLE_SECONDS, WINDOW, peak_rate
from p2pdl.testing import open_nodes, wait_for_dht

MB = 1 << 20


def test_small_or_instant_transfers_are_no_samples():
    estimator = CapacityEstimator()
    assert estimator.estimate() == CapacityEstimate(None, None, 0)
    assert estimator.estimate().bandwidth is None
    assert not estimator.record("up", MIN_SAMPLE_BYTES - 1, 1.0)
    assert not estimator.record("up", 10 * MB, MIN_SAMPLE_SECONDS / 2)
    assert not estimator.record("up", 10 * MB, math.nan)
    assert estimator.record("up", 10 * MB, 1.0)
    assert estimator.rate("up") == 10 * MB and estimator.rate("down") is None
    assert estimator.estimate().bandwidth == 10 * MB   # the one direction known
    with pytest.raises(ValueError):
        estimator.record("sideways", MB, 1.0)


def test_one_slow_round_and_one_fast_one_move_no_estimate():
    estimator = CapacityEstimator()
    for seconds in (1.0, 1.0, 1.0, 10.0):      # 10 MB/s, and one round held up
        estimator.record("down", 10 * MB, seconds)
    assert estimator.rate("down") == 10 * MB
    estimator.record("down", 10 * MB, 0.1)      # one round measured ten times too fast
    assert estimator.rate("down") == 10 * MB
    estimator.record("up", 5 * MB, 1.0)
    assert estimator.estimate().bandwidth == 5 * MB   # the lesser direction
    assert estimator.estimate().samples == 6


def test_the_estimate_follows_the_last_window_of_rounds():
    estimator = CapacityEstimator()
    for _ in range(WINDOW):
        estimator.record("up", 100 * MB, 1.0)
    for _ in range(WINDOW - 1):                 # the link got slower
        estimator.record("up", 10 * MB, 1.0)
    assert estimator.rate("up") == 10 * MB      # one fast round left in the window
    with pytest.raises(ValueError):
        CapacityEstimator(0)


def test_the_peak_rate_is_where_several_streams_ran_at_once():
    """Four streams share a 4 MB/s link for 1 s (1 MB/s each); then one slow
    stream goes on alone at 0.5 MB/s for 3 s.  The mean over the span says
    1.75 MB/s; the peak over a quarter of the span says the link's 4 MB/s."""
    frames = [(0.01 * k, 40_000) for k in range(1, 101)]            # 4 MB/s for 1 s
    frames += [(1.0 + 0.01 * k, 5_000) for k in range(1, 301)]      # 0.5 MB/s for 3 s
    assert peak_rate(frames, 1.0) == pytest.approx(4e6, rel=0.02)
    assert peak_rate(frames, 5.0) is None            # longer than the span
    assert peak_rate(frames[:1], 0.1) is None
    estimator = CapacityEstimator()
    assert estimator.record_frames("up", frames)
    assert estimator.rate("up") == pytest.approx(4e6, rel=0.02)
    assert not estimator.record_frames("down", [])
    assert not estimator.record_frames("down", frames[:5])    # 200 kB: too little


def test_reducing_is_measured_in_input_bytes_per_second_of_work():
    estimator = CapacityEstimator()
    assert not estimator.record("reduce", 10 * MB, 0.0005)  # below MIN_REDUCE_SECONDS
    assert estimator.record("reduce", 10 * MB, 0.01)         # CPU work: 10 ms is plenty
    assert estimator.estimate().reduce == 1000 * MB
    assert estimator.estimate().bandwidth is None             # not a link
    with pytest.raises(ValueError):
        estimator.record_frames("reduce", [(0.0, MB), (1.0, MB)])


def test_a_steady_transfer_measures_its_rate():
    frames = [(0.001 * k, 1000) for k in range(1, 5001)]        # 1 MB/s for 5 s
    estimator = CapacityEstimator()
    estimator.record_frames("down", list(reversed(frames)))     # any order
    assert estimator.rate("down") == pytest.approx(1e6, rel=0.01)


async def test_rounds_measure_the_rates_and_the_next_round_offers_them(monkeypatch):
    """Over real streams (loopback TCP): a round of 2 MB per member gives
    samples; a later round's group carries each
    member's measured bandwidth (the load plan's input), where nobody typed
    one.  (A loopback transfer may take less than MIN_SAMPLE_SECONDS.)"""
    monkeypatch.setattr(capacity, "MIN_SAMPLE_SECONDS", 1e-4)
    monkeypatch.setattr(capacity, "MIN_REDUCE_SECONDS", 1e-5)
    config = AllReduceConfig(averaging_timeout=30.0)
    async with open_nodes(3) as nodes:
        await wait_for_dht(nodes)
        groups = {}

        async def one(i, epoch):
            values = [torch.randn(1_000_000, generator=torch.Generator().manual_seed(i))]
            result = await average_round(nodes[i].matchmaking, nodes[i].allreduce,
                                         "measured", epoch, values, weight=1.0,
                                         config=config)
            groups[i] = result.group

        for epoch in (1, 2, 3):
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i, epoch)
            if epoch == 1:
                assert all(m.bandwidth is None for m in groups[0].members)
                pass
        for node in nodes:
            # (on loopback a direction's frames may all move at one instant: no
            # span to measure that way in that round)
            estimate = node.allreduce.capacity()
            assert estimate.bandwidth is not None and estimate.bandwidth > 0, estimate
            assert estimate.reduce is not None and estimate.reduce > 0, estimate
            assert node.allreduce.statistics()["capacity_samples"] >= 2
        assert all(m.bandwidth is not None and m.bandwidth > 0 for m in groups[0].members)
        assert all(m.reduce_rate is not None and m.reduce_rate > 0 for m in groups[0].members)
