"""Measured capacities on capped links: the DeDLOC tiers (scaled) in the emulated
internet, where every peer's upload estimate lands near its cap and the plan from
the measured bandwidths, nobody typing one, is about as fast as the plan from
the true caps (simulations/_allreduce_netlab.py, its ``measured`` mode)."""

from __future__ import annotations

import argparse

import pytest

from simulations._allreduce_netlab import AUXILIARY, run_netlab

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_upload_estimates_land_near_the_caps_and_the_measured_plan_keeps_pace(lab_required):
    args = argparse.Namespace(scale=8.0, numel=1_500_000, rounds=1, raw_tcp=False,
                              timeout=200.0)
    out = run_netlab(args)
    assert not out["note"].startswith("failed"), out["note"]
    assert out["correct_rounds"] == {"lp": "1/1", "equal": "1/1", "measured": "1/1"}, out
    for i, estimate in enumerate(out["capacity_estimates"]):
        if i in AUXILIARY:   # its results are paced by the slowest sender: a lower bound
            assert estimate["up_vs_cap"] is not None and estimate["up_vs_cap"] > 0.2
            continue
        # TCP payload carries 0.956 of a cap; the first window counts what the
        # socket buffer took at once (docs/allreduce.md, Measured capacities)
        assert 0.8 <= estimate["up_vs_cap"] <= 1.15, out["capacity_estimates"]
    measured = out["fractions"]["measured"]
    assert measured and measured != out["fractions"]["equal"]
    assert max(measured) == measured[AUXILIARY[0]]   # the fast auxiliary peer does most
    assert out["measured_plan_vs_true_caps"] <= 1.3, out
