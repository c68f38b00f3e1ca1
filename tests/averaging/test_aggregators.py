"""Robust aggregation rules (sans-IO): CenteredClip against a plain reference,
the coordinate-wise rules against theirs, and the attacks of the literature
against groups with 1 of 4 and 3 of 8 malicious members."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdl.averaging import Aggregator, CapacityEstimate, Layout, PartReducer, get_codec
from p2pdl.averaging._aggregators import (
    AUTO_TAU_FACTOR,
    centered_clip,
    centered_clip_reference,
)
from p2pdl.errors import ConfigError
from p2pdl.wire import TensorHeader

pytestmark = pytest.mark.timeout(120)


def fixed_point_residual(rows, p, v, tau):
    """|sum_i p_i min(1, tau/|x_i - v|)(x_i - v)|, in float64."""
    x = rows.double()
    diff = x - v.double()
    norms = torch.linalg.vector_norm(diff, dim=1)
    scale = torch.clamp(tau / torch.clamp(norms, min=1e-300), max=1.0)
    return float(torch.linalg.vector_norm(torch.mv(diff.T, p.double() * scale)))


def objective(rows, p, v, tau):
    """sum_i p_i huber_tau(|x_i - v|): CenteredClip's fixed points are its minimisers."""
    r = torch.linalg.vector_norm(rows.double() - v.double(), dim=1)
    huber = torch.where(r <= tau, r * r / 2, tau * r - tau * tau / 2)
    return float(p.double() @ huber)


def coordinate_median_start(rows):
    return torch.median(rows, dim=0).values.clone()


@st.composite
def groups(draw):
    n = draw(st.integers(2, 8))
    c = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    spread = draw(st.floats(0.05, 5.0))
    tau = draw(st.floats(0.2, 5.0))
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, c, generator=gen) * spread
    weights = draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
    return rows, weights, tau


@settings(max_examples=60, deadline=None)
@given(groups())
def test_centered_clip_reaches_the_fixed_point_of_the_plain_iteration(group):
    rows, weights, tau = group
    total = math.fsum(weights)
    p = torch.tensor([w / total for w in weights], dtype=torch.float32)
    fast = torch.empty(rows.shape[1])
    distances = centered_clip(rows, p, fast, tau, 1000, 1e-7)
    assert torch.isfinite(fast).all()
    assert distances == pytest.approx(torch.linalg.vector_norm(rows - fast, dim=1).tolist(),
                                      rel=1e-3, abs=1e-4 * (float(rows.abs().max()) + tau))
    # The definition: the clipped differences cancel (up to float32 rounding).
    scale = float(rows.abs().max()) + tau
    assert fixed_point_residual(rows, p, fast, tau) <= 1e-4 * scale
    # BTARD's iteration from the coordinate median, run to convergence,
    # minimises the same convex objective (its minimiser need not be unique:
    # between two far points every v is one).
    reference = coordinate_median_start(rows)
    ref_steps = centered_clip_reference(rows, p, reference, tau, 20000, 1e-8)
    if ref_steps < 20000:
        assert abs(objective(rows, p, fast, tau) - objective(rows, p, reference, tau)) \
            <= 1e-4 * scale * scale


def test_the_public_rule_matches_the_reference_on_a_large_chunk():
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(6, 50_000, generator=gen) * 0.002 + 1.0
    rows[0] *= -10
    weights = [1.0, 2.0, 1.0, 3.0, 1.0, 1.0]
    p = torch.tensor([w / sum(weights) for w in weights])
    out = torch.empty(50_000)
    Aggregator("centered_clip", tau=1.0).aggregate(rows, weights, out)
    reference = coordinate_median_start(rows)
    centered_clip_reference(rows, p, reference, 1.0, 5000, 1e-9)
    assert float((out - reference).norm()) < 1e-3


def test_median_and_trimmed_mean_match_their_definitions():
    gen = torch.Generator().manual_seed(2)
    for n in (2, 3, 4, 7, 8):
        rows = torch.randn(n, 333, generator=gen)
        out = torch.empty(333)
        Aggregator("median").aggregate(rows, [1.0] * n, out)
        assert torch.equal(out, torch.median(rows, dim=0).values)  # the lower median
        for k in range(0, (n - 1) // 2 + 1):
            if k / n >= 0.5:
                continue
            Aggregator("trimmed_mean", trim=k / n).aggregate(rows, [1.0] * n, out)
            kept = torch.sort(rows, dim=0).values[k:n - k]
            assert torch.allclose(out, kept.mean(dim=0), atol=1e-5), (n, k)


def test_weighted_median_and_trimmed_mean_count_weights():
    rows = torch.tensor([[0.0, 10.0], [1.0, 20.0], [2.0, 30.0]])
    out = torch.empty(2)
    Aggregator("median").aggregate(rows, [1.0, 1.0, 5.0], out)
    assert out.tolist() == [2.0, 30.0]  # the heavy row holds more than half
    Aggregator("median").aggregate(rows, [3.0, 1.0, 1.0], out)
    assert out.tolist() == [0.0, 10.0]
    # trim 0.25 of weights [1, 2, 1]: the first and last rows are cut away
    # entirely, the middle one remains.
    Aggregator("trimmed_mean", trim=0.25).aggregate(rows, [1.0, 2.0, 1.0], out)
    assert torch.allclose(out, torch.tensor([1.0, 20.0]))


def test_every_rule_returns_a_lone_contributors_values_and_rejects_bad_settings():
    row = torch.randn(1, 50)
    for name in ("mean", "centered_clip", "trimmed_mean", "median"):
        out = torch.empty(50)
        Aggregator(name).aggregate(row, [3.0], out)
        assert torch.equal(out, row[0])
    for bad in ({"name": "krum"}, {"tau": 0.0}, {"tau": math.inf}, {"iterations": 0},
                {"iterations": 10**6}, {"trim": 0.5}, {"tolerance": -1.0}):
        with pytest.raises(ConfigError):
            Aggregator(**bad)


def test_the_rule_is_part_of_the_layout_digest_and_the_mean_keeps_the_old_one():
    codecs = [get_codec("none")]
    mean = Layout([100], codecs, [1.0], 1024)
    assert Layout([100], codecs, [1.0], 1024, Aggregator()).digest == mean.digest
    clip = Layout([100], codecs, [1.0], 1024, Aggregator("centered_clip"))
    other_tau = Layout([100], codecs, [1.0], 1024, Aggregator("centered_clip", tau=2.0))
    median = Layout([100], codecs, [1.0], 1024, Aggregator("median"))
    assert len({mean.digest, clip.digest, other_tau.digest, median.digest}) == 4
    assert Aggregator().digest() is None
    assert Aggregator("centered_clip").digest() != Aggregator("centered_clip", tau=2.0).digest()


# -- attacks --------------------------------------------------------------------------

DIM = 2000
TAU = 1.0


def honest_rows(count, gen):
    """Honest gradients: a common direction plus noise, within tau/2 of their mean."""
    mu = torch.randn(DIM, generator=gen)
    mu *= 3.0 / float(mu.norm())
    noise = torch.randn(count, DIM, generator=gen)
    noise *= 0.2 * TAU / torch.linalg.vector_norm(noise, dim=1, keepdim=True)
    return mu + noise


def attack(name, honest, bad, gen):
    """The malicious members' rows, knowing the honest ones (the strongest case)."""
    mean = honest.mean(dim=0)
    std = honest.std(dim=0)
    if name == "sign_flip":
        return -10 * honest[:bad]
    if name == "scaled":
        return 100 * honest[:bad]
    if name == "gaussian":
        return torch.randn(bad, DIM, generator=gen) * 10.0
    if name == "alie":  # A Little Is Enough: mean - z * std per coordinate
        return (mean - 1.5 * std).expand(bad, DIM).clone()
    if name == "ipm":   # inner product manipulation: -eps * mean
        return (-4.0 * mean).expand(bad, DIM).clone()
    if name == "constant":
        direction = torch.ones(DIM) / math.sqrt(DIM)
        return (1000.0 * direction).expand(bad, DIM).clone()
    raise AssertionError(name)


ATTACKS = ["sign_flip", "scaled", "gaussian", "alie", "ipm", "constant"]


@pytest.mark.parametrize("size,bad", [(4, 1), (8, 3)])
@pytest.mark.parametrize("name", ATTACKS)
def test_centered_clip_keeps_the_result_near_the_honest_mean(name, size, bad):
    gen = torch.Generator().manual_seed(hash((name, size)) % 2**31)
    honest = honest_rows(size - bad, gen)
    rows = torch.cat([attack(name, honest, bad, gen), honest])
    weights = [1.0] * size
    truth = honest.mean(dim=0)
    # The documented bound: (share of the malicious weight / honest share) * tau
    # when the honest values lie within tau of the result.
    bound = bad / (size - bad) * TAU
    robust = torch.empty(DIM)
    Aggregator("centered_clip", tau=TAU).aggregate(rows, weights, robust)
    assert torch.isfinite(robust).all()
    assert float((robust - truth).norm()) <= bound * 1.01 + 1e-4
    plain = torch.empty(DIM)
    Aggregator("mean").aggregate(rows, weights, plain)
    if name not in ("alie",):  # ALIE's shift is small by design
        assert float((plain - truth).norm()) > bound


@pytest.mark.parametrize("size,bad", [(4, 1), (8, 3)])
@pytest.mark.parametrize("name", ATTACKS)
def test_auto_tau_bounds_every_attack_without_tuning(name, size, bad):
    """tau="auto" takes each chunk's radius from the contributors' own distances:
    the same bound as a well-chosen tau, at any scale of the values."""
    gen = torch.Generator().manual_seed(hash((name, size, "auto")) % 2**31)
    for scale in (1e-4, 1.0, 1e3):   # no tau fits all three
        honest = honest_rows(size - bad, gen) * scale
        rows = torch.cat([attack(name, honest / scale, bad, gen) * scale, honest])
        truth = honest.mean(dim=0)
        spread = float(torch.cdist(honest, honest).max())   # the radius is at most this
        robust = torch.empty(DIM)
        Aggregator("centered_clip", tau="auto").aggregate(rows, [1.0] * size, robust)
        assert torch.isfinite(robust).all()
        error = float((robust - truth).norm())
        assert error <= bad / (size - bad) * AUTO_TAU_FACTOR * spread * 1.01 + 1e-6 * scale
        plain = torch.empty(DIM)
        Aggregator("mean").aggregate(rows, [1.0] * size, plain)
        if name != "alie":
            assert error < float((plain - truth).norm())


def test_auto_tau_leaves_honest_rows_alone():
    gen = torch.Generator().manual_seed(11)
    for count in (2, 3, 8):
        honest = honest_rows(count, gen)
        out, mean = torch.empty(DIM), honest.mean(dim=0)
        Aggregator("centered_clip", tau="auto").aggregate(honest, [1.0] * count, out)
        spread = float(torch.linalg.vector_norm(honest - mean, dim=1).max())
        # two rows: neither is clipped (the mean); more: within a small part of the spread
        assert float((out - mean).norm()) <= (1e-5 if count == 2 else 0.25) * spread
    same = torch.ones(4, DIM)
    out = torch.empty(DIM)
    Aggregator("centered_clip", tau="auto").aggregate(same, [1.0] * 4, out)
    assert torch.equal(out, same[0])


def test_auto_tau_is_part_of_the_layout():
    clip = Aggregator("centered_clip", tau="auto")
    assert clip.describe() == ["centered_clip", "auto", 100, 1e-6]
    assert clip.digest() != Aggregator("centered_clip").digest()
    with pytest.raises(ConfigError, match="tau"):
        Aggregator("centered_clip", tau="automatic")


@pytest.mark.parametrize("name", ATTACKS)
def test_median_and_trimmed_mean_bound_one_of_four(name):
    gen = torch.Generator().manual_seed(7)
    honest = honest_rows(3, gen)
    rows = torch.cat([attack(name, honest, 1, gen), honest])
    low, high = honest.min(dim=0).values, honest.max(dim=0).values
    for rule in (Aggregator("median"), Aggregator("trimmed_mean", trim=0.25)):
        out = torch.empty(DIM)
        rule.aggregate(rows, [1.0] * 4, out)
        # coordinate-wise rules stay within the honest range of each coordinate
        assert bool(((out >= low - 1e-6) & (out <= high + 1e-6)).all()), rule.name


# -- the reducer ----------------------------------------------------------------------


def test_a_reducer_with_centered_clip_averages_chunk_by_chunk_in_bounded_memory():
    codec = get_codec("none")
    size, values, chunk = 5, 5000, 1024
    layout = Layout([values], [codec], [1.0, 0, 0, 0, 0], chunk, Aggregator("centered_clip"))
    gen = torch.Generator().manual_seed(3)
    xs = torch.randn(size, values, generator=gen) * 0.01
    xs[4] = 50.0  # a malicious sender
    reducer = PartReducer(layout, 0, [1, 2, 3, 4], xs[0].clone(), 1.0, 0, 0.0, 10.0,
                          max_ahead=1)
    for s in (1, 2, 3, 4):
        reducer.begin(s, 1.0, True, 0.0)
    peak = 0
    for spec in layout.chunks[0]:
        lo = spec.start
        for s in (1, 2, 3, 4):
            assert reducer.wants_chunk(s)
            header = TensorHeader(0, "float32", (values,), lo, spec.count, "none", None)
            reducer.add_chunk(s, header, codec.encode(xs[s, lo:lo + spec.count]), 0.0)
        peak = max(peak, sum(len(h) for h in reducer.held))
        assert reducer.finalize() == [spec.index]
    assert reducer.complete and peak <= 4
    result = reducer.result()
    for spec in layout.chunks[0]:
        lo = spec.start
        expected = torch.empty(spec.count)
        Aggregator("centered_clip").aggregate(xs[:, lo:lo + spec.count].contiguous(),
                                              [1.0] * size, expected)
        assert torch.equal(result[lo:lo + spec.count], expected)
    honest = xs[:4].mean(dim=0)
    # The bound holds per chunk: (1/4) * tau each (the mean is 10 per value off).
    for spec in layout.chunks[0]:
        lo = spec.start
        assert float((result[lo:lo + spec.count] - honest[lo:lo + spec.count]).norm()) \
            <= 0.25 * 1.01


def test_a_reducer_notes_senders_whose_values_are_outliers():
    codec = get_codec("none")
    layout = Layout([3000], [codec], [1.0, 0, 0, 0], 1024, Aggregator("centered_clip", tau=1.0))
    gen = torch.Generator().manual_seed(4)
    xs = torch.randn(4, 3000, generator=gen) * 0.01
    xs[2] *= 5000  # far beyond 10 x tau from the result
    reducer = PartReducer(layout, 0, [1, 2, 3], xs[0].clone(), 1.0, 0, 0.0, 10.0,
                          outlier_factor=10.0)
    for s in (1, 2, 3):
        reducer.begin(s, 1.0, True, 0.0)
    for spec in layout.chunks[0]:
        for s in (1, 2, 3):
            header = TensorHeader(0, "float32", (3000,), spec.start, spec.count, "none", None)
            reducer.add_chunk(s, header, codec.encode(xs[s, spec.start:spec.end]), 0.0)
        reducer.finalize()
    assert set(reducer.outliers) == {2} and reducer.outliers[2] > 10
    # the same values without outlier detection, or under the mean: nobody noted
    quiet = PartReducer(layout, 0, [1, 2, 3], xs[0].clone(), 1.0, 0, 0.0, 10.0)
    assert quiet.outliers == {}


def test_the_flag_book_bans_a_repeated_outlier_from_its_run_for_a_while():
    from libp2p.peer.id import ID

    from p2pdl.service import FlagBook

    book = FlagBook(ban_seconds=100.0)
    peer = ID(b"\x00\x04abcd")
    for t in range(2):
        book.flag(peer, "run", "outlier_values", float(t))
        book.flag(peer, "run", "weight_beyond_evidence", float(t))  # never bans alone
        assert not book.is_banned(peer, "run", float(t))
    book.flag(peer, "other", "outlier_values", 2.0)  # strikes count per run
    assert not book.is_banned(peer, "run", 2.0)
    book.flag(peer, "run", "outlier_values", 3.0)
    assert book.is_banned(peer, "run", 3.0) and not book.is_banned(peer, "other", 3.0)
    assert book.banned("run", 3.0)[peer.to_base58()]["until"] == 103.0
    assert not book.is_banned(peer, "run", 103.0)   # it expires
    assert book.banned("run", 104.0) == {}


def test_an_honest_peer_of_few_samples_is_not_an_outlier():
    """Its mean is noisier by sqrt(samples ratio); distances are scaled for that."""
    codec = get_codec("none")
    layout = Layout([3000], [codec], [1.0, 0, 0, 0], 1024, Aggregator("centered_clip", tau=0.01))
    gen = torch.Generator().manual_seed(8)
    samples = [1000.0, 1000.0, 1000.0, 1.0]   # member 3: a slow laptop
    xs = torch.stack([torch.ones(3000) + torch.randn(3000, generator=gen) / math.sqrt(n)
                      for n in samples])
    reducer = PartReducer(layout, 0, [1, 2, 3], xs[0].clone(), samples[0], 0, 0.0, 10.0,
                          outlier_factor=10.0)
    for s in (1, 2, 3):
        reducer.begin(s, samples[s], True, 0.0)
    for spec in layout.chunks[0]:
        for s in (1, 2, 3):
            header = TensorHeader(0, "float32", (3000,), spec.start, spec.count, "none", None)
            reducer.add_chunk(s, header, codec.encode(xs[s, spec.start:spec.end]), 0.0)
        reducer.finalize()
    assert reducer.outliers == {}


def test_a_small_chunk_judges_over_the_whole_part_not_alone():
    """In a chunk of a few values honest distances do not concentrate: one honest
    member may land ten times the median distance there by chance.  Judged over
    the whole part, with a chunk of many values beside it, it is not an outlier."""
    codec = get_codec("none")
    layout = Layout([4, 3000], [codec, codec], [1.0, 0, 0, 0], 1024,
                    Aggregator("centered_clip", tau="auto"))
    gen = torch.Generator().manual_seed(9)
    xs = torch.randn(4, 3004, generator=gen) * 0.01
    xs[:, :4] = torch.tensor([0.0, 0.0, 0.0, 0.0])
    xs[3, :4] = torch.tensor([0.0, 0.0, 0.0, 0.05])   # far, by the others' tiny distances

    def judge(chunks: int) -> dict[int, float]:
        reducer = PartReducer(layout, 0, [1, 2, 3], xs[0].clone(), 1.0, 0, 0.0, 10.0,
                              outlier_factor=10.0)
        for s in (1, 2, 3):
            reducer.begin(s, 1.0, True, 0.0)
        for spec in layout.chunks[0][:chunks]:
            for s in (1, 2, 3):
                header = TensorHeader(0, "float32", (3004,), spec.start, spec.count, "none",
                                      None)
                reducer.add_chunk(s, header, codec.encode(xs[s, spec.start:spec.end]), 0.0)
            reducer.finalize()
        return reducer.outliers

    assert judge(1) == {}                 # 4 values: too few to judge anyone
    assert judge(len(layout.chunks[0])) == {}   # the whole part: an honest spread
    xs[3, 4:] *= 1000                     # a real outlier over the whole part is caught
    assert set(judge(len(layout.chunks[0]))) == {3}


def test_auto_tau_counts_the_medoid_so_a_heavier_third_sets_no_radius():
    """Three rows: two honest (weights 8 and 9), one far (weight 9).  Among the
    rows other than the medoid the far one may hold more than half of the
    weight; counted with the medoid's own distance (0) it holds a third, and
    the radius stays an honest distance."""
    gen = torch.Generator().manual_seed(5)
    common = torch.randn(DIM, generator=gen)
    rows = torch.stack([common + 0.1 * torch.randn(DIM, generator=gen),
                        common + 0.1 * torch.randn(DIM, generator=gen),
                        -100 * common])
    honest = float(torch.dist(rows[0], rows[1]))
    for weights in ([8.0, 9.0, 9.0], [9.0, 8.0, 9.0]):
        radii: list[float] = []
        out = torch.empty(DIM)
        Aggregator("centered_clip", tau="auto").aggregate(rows, weights, out, radii)
        assert radii == [pytest.approx(honest)]
        truth = (rows[0] * weights[0] + rows[1] * weights[1]) / (weights[0] + weights[1])
        assert float((out - truth).norm()) <= 9 / 17 * honest * 1.01


def test_matchmaking_compares_the_rule_and_the_caps():
    """``average_round`` hands matchmaking the config's aggregation digest: the
    rule and, under a robust rule, the weight caps (part of the layout too)."""
    from p2pdl.averaging import AllReduceConfig

    default = AllReduceConfig()
    assert AllReduceConfig(aggregator=Aggregator()).aggregation_digest() is None
    assert default.aggregation_digest() == AllReduceConfig().aggregation_digest()
    others = [AllReduceConfig(max_weight_share=0.4), AllReduceConfig(max_weight_ratio=None),
              AllReduceConfig(max_weight_ratio=2.0),
              AllReduceConfig(aggregator=Aggregator("centered_clip", tau=2.0))]
    digests = {default.aggregation_digest()} | {c.aggregation_digest() for c in others}
    assert len(digests) == 1 + len(others)
    assert all(len(d) == 32 for d in digests)


async def test_a_round_forms_groups_by_rule_and_caps():
    from p2pdl.averaging import AllReduceConfig, average_round

    seen = {}

    class Matchmaking:
        async def form_group(self, run_id, epoch, **options):
            seen.update(options)
            raise RuntimeError("stop here")

    class Averaging:   # what the node's rounds measured of its rates
        @staticmethod
        def capacity():
            return CapacityEstimate(4e6, 2e6, 3, reduce=8e6)

    config = AllReduceConfig(max_weight_ratio=2.0)
    with pytest.raises(RuntimeError):
        await average_round(Matchmaking(), Averaging(), "run", 1, [], weight=1.0, config=config)
    assert seen["aggregation"] == config.aggregation_digest()
    assert seen["bandwidth"] == 2e6     # measured: the lesser direction
    assert seen["reduce_rate"] == 8e6
    with pytest.raises(RuntimeError):   # what the caller says comes first
        await average_round(Matchmaking(), Averaging(), "run", 1, [], weight=1.0,
                            config=config, bandwidth=5e5)
    assert seen["bandwidth"] == 5e5
