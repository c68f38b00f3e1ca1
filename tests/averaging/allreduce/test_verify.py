"""Reducer verification, sans-IO (p2pdl.averaging.allreduce._verify): an honest
reducer's result passes whatever its contributors send, a result that is not
its rule's fails, a contributor's lie is bounded, and the directions are the
same bits on every machine."""

from __future__ import annotations

import functools
import hashlib
import math
import time

import pytest
import torch
import trio

from p2pdl.averaging import Aggregator, CodecPolicy, Layout, PartReducer
from p2pdl.averaging.allreduce._verify import (
    NORM_SLACK,
    SKETCH_BUCKETS,
    TAU_SLACK,
    ChunkClaim,
    Report,
    Scratch,
    SketchPlanner,
    check_part,
    contributor_report,
    sketch,
    sketch_bound,
    sketch_plan,
)

pytestmark = pytest.mark.timeout(120)

GROUP = hashlib.sha256(b"verify").digest()
RULES = {"mean": Aggregator(), "centered_clip": Aggregator("centered_clip", tau="auto"),
         "centered_clip_fixed": Aggregator("centered_clip", tau=0.5)}


def reduce_part(layout: Layout, part: int, rows: torch.Tensor, weights: list[float]
                ) -> tuple[torch.Tensor, list[ChunkClaim], torch.Tensor]:
    """Run the real PartReducer for ``part`` (member ``part`` reduces it; every
    member contributes ``rows[j]``).  Returns the result as every member holds
    it, the reducer's claims, and each contributor's values of the part as the
    reducer decoded them."""
    lo, hi = layout.part_bounds[part]
    n = rows.shape[0]
    senders = [j for j in range(n) if j != part]
    reducer = PartReducer(layout, part, senders, rows[part, lo:hi].clone(), weights[part],
                          part, 0.0, 10.0, max_share=0.5, max_ratio=1.0)
    decoded = rows[:, lo:hi].clone()
    decoded[part] = reducer.local   # (sparsified, under topk)
    for j in senders:
        reducer.begin(j, weights[j], True, 0.0)
    for chunk in layout.chunks[part]:
        for j in senders:
            payload = chunk.codec.encode(rows[j, chunk.start:chunk.end])
            reducer.add_chunk(j, chunk.header(), payload, 0.0)
            a = chunk.start - chunk.part_start
            decoded[j, a:a + chunk.count] = chunk.codec.decode(bytes(payload), chunk.count)
        reducer.finalize()
    assert reducer.complete
    return reducer.result().clone(), reducer.claims, decoded


def reports_for(layout: Layout, part: int, result: torch.Tensor, claims: list[ChunkClaim],
                decoded: torch.Tensor, nonce: bytes) -> dict[int, Report]:
    plan = sketch_plan(GROUP, part, nonce, result.numel())
    members = sorted({j for c in claims for j in c.contributors})
    return {j: contributor_report(layout, part, decoded[j], result, claims, j, plan)
            for j in members}


def scenario(rule: str, codec: str, seed: int, *, n: int = 4, numel: int = 6000,
             attack: str | None = None) -> tuple[Layout, torch.Tensor, list[float]]:
    gen = torch.Generator().manual_seed(seed)
    policy = CodecPolicy(large=codec, threshold=100)
    # the caps reduce_part's reducers apply: checked under a robust rule
    layout = Layout.for_tensors([37, numel], [1.0 / n] * n, policy, 1024, RULES[rule],
                                caps=(0.5, 1.0))
    common = torch.randn(numel + 37, generator=gen)
    rows = torch.stack([common + 0.1 * torch.randn(numel + 37, generator=gen)
                        for _ in range(n)])
    if attack == "scaled":
        rows[n - 1] *= -100
    elif attack == "constant":
        rows[n - 1] = common + 3.0
    weights = [float(8 + j) for j in range(n)]
    return layout, rows, weights


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("codec", ["none", "fp16", "topk", "qtopk"])
@pytest.mark.parametrize("attack", [None, "scaled", "constant"])
def test_an_honest_reducer_passes_whatever_its_contributors_send(rule, codec, attack):
    for seed in range(3):
        layout, rows, weights = scenario(rule, codec, seed, attack=attack)
        for part in range(len(weights)):
            result, claims, decoded = reduce_part(layout, part, rows, weights)
            for nonce in (b"a" * 32, b"b" * 32):
                reports = reports_for(layout, part, result, claims, decoded, nonce)
                verdict = check_part(layout, part, result, claims, reports)
                assert verdict.status == "ok", (rule, codec, attack, seed, part, verdict)
                assert not verdict.liars and not verdict.missing


def lie(kind: str, result: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if kind == "shifted":
        return result + 0.5       # half of the values' typical size, everywhere
    if kind == "zeroed":
        return torch.zeros_like(result)
    if kind == "scaled":
        return result * 1.5
    if kind == "swapped":   # another part's result (or its values reversed)
        return other[:result.numel()].clone() if other.numel() >= result.numel() \
            else result.flip(0)
    raise AssertionError(kind)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("kind", ["shifted", "zeroed", "scaled", "swapped"])
@pytest.mark.parametrize("codec", ["fp16", "topk", "qtopk"])
def test_a_result_that_is_not_the_rules_fails_every_time(rule, kind, codec):
    for seed in range(3):
        layout, rows, weights = scenario(rule, codec, seed)
        honest = [reduce_part(layout, part, rows, weights) for part in range(len(weights))]
        for part, (result, claims, decoded) in enumerate(honest):
            other = honest[(part + 1) % len(honest)][0]
            forged = lie(kind, result, other)
            for chunk in layout.chunks[part]:   # as members receive it: through the codec
                piece = forged[chunk.start - chunk.part_start:chunk.end - chunk.part_start]
                chunk.result_codec.decode(chunk.result_codec.encode(piece), chunk.count,
                                          out=piece)
            for nonce in (b"a" * 32, b"c" * 32):
                reports = reports_for(layout, part, forged, claims, decoded, nonce)
                verdict = check_part(layout, part, forged, claims, reports)
                assert verdict.status == "failed", (rule, kind, seed, part, verdict)


def test_claimed_weights_beyond_the_layouts_caps_fail():
    """A reducer that counts a contributor (itself, say) for more than the caps
    allow fails, however consistent its result is with those weights."""
    layout, rows, weights = scenario("centered_clip", "none", 2)
    assert layout.caps == (0.5, 1.0)
    greedy = weights[:]
    greedy[0] = 100.0 * max(weights)
    lo, hi = layout.part_bounds[0]
    reducer = PartReducer(layout, 0, [1, 2, 3], rows[0, lo:hi].clone(), greedy[0], 0, 0.0,
                          10.0, max_share=1.0, max_ratio=None)   # applies no cap
    for j in (1, 2, 3):
        reducer.begin(j, greedy[j], True, 0.0)
    for chunk in layout.chunks[0]:
        for j in (1, 2, 3):
            reducer.add_chunk(j, chunk.header(), chunk.codec.encode(rows[j, chunk.start:
                                                                        chunk.end]), 0.0)
        reducer.finalize()
    result, claims = reducer.result().clone(), reducer.claims
    reports = reports_for(layout, 0, result, claims, rows[:, lo:hi].clone(), b"n" * 32)
    verdict = check_part(layout, 0, result, claims, reports)
    assert verdict.status == "failed" and "beyond the caps" in verdict.reason
    # The same claims under the caps pass; a layout without caps checks none.
    honest, honest_claims, decoded = reduce_part(layout, 0, rows, greedy)
    assert check_part(layout, 0, honest, honest_claims,
                      reports_for(layout, 0, honest, honest_claims, decoded, b"n" * 32)
                      ).status == "ok"
    uncapped = Layout.for_tensors([37, 6000], [0.25] * 4, CodecPolicy(large="none",
                                                                      threshold=100),
                                  1024, RULES["centered_clip"])
    assert uncapped.caps is None and uncapped.digest != layout.digest
    assert check_part(uncapped, 0, result, claims, reports).status == "ok"


def test_a_radius_far_from_the_contributors_distances_fails():
    layout, rows, weights = scenario("centered_clip", "none", 1, attack="scaled")
    result, claims, decoded = reduce_part(layout, 0, rows, weights)
    # the radius that would let the scaled member count unclipped: refused
    wide = [ChunkClaim(c.contributors, c.weights, c.tau * 1000) for c in claims]
    reports = reports_for(layout, 0, result, wide, decoded, b"n" * 32)
    verdict = check_part(layout, 0, result, wide, reports)
    assert verdict.status == "failed" and "radius" in verdict.reason
    assert all(c.tau <= TAU_SLACK * 2 for c in claims)  # the honest radii are far below
    # a radius near 0 would make the rounding allowance (which grows as 1 / tau)
    # mean nothing: refused too
    tiny = [ChunkClaim(c.contributors, c.weights, c.tau / 1000) for c in claims]
    reports = reports_for(layout, 0, result, tiny, decoded, b"n" * 32)
    verdict = check_part(layout, 0, result, tiny, reports)
    assert verdict.status == "failed" and "below" in verdict.reason
    # a fixed radius must be the rule's
    fixed = Layout.for_tensors([37, 6000], [0.25] * 4, CodecPolicy(large="none"), 1024,
                               RULES["centered_clip_fixed"])
    result, claims, decoded = reduce_part(fixed, 0, rows, weights)
    assert all(c.tau == 0.5 for c in claims)
    other = [ChunkClaim(c.contributors, c.weights, 0.25) for c in claims]
    reports = reports_for(fixed, 0, result, other, decoded, b"n" * 32)
    assert check_part(fixed, 0, result, other, reports).status == "failed"


def norm(values) -> float:
    return math.sqrt(sum(v * v for v in values))


def test_a_sketch_beyond_its_bound_is_a_lie_and_counts_as_unknown():
    layout, rows, weights = scenario("centered_clip", "fp16", 2)
    result, claims, decoded = reduce_part(layout, 1, rows, weights)
    reports = reports_for(layout, 1, result, claims, decoded, b"x" * 32)
    bound = sketch_bound(claims, 3)
    assert bound is not None and bound <= NORM_SLACK
    # every honest sketch keeps its terms' norm within a few percent
    for j, report in reports.items():
        assert norm(report.sketch) <= bound, j
    reports[3] = Report((bound * 1.01,) + (0.0,) * (SKETCH_BUCKETS - 1), reports[3].distances)
    verdict = check_part(layout, 1, result, claims, reports)
    assert verdict.liars == {3} and verdict.status == "ok"   # the honest result holds
    zeros = (0.0,) * SKETCH_BUCKETS
    for bad in (Report((math.nan,) + zeros[1:], reports[0].distances),
                Report(zeros[1:], reports[0].distances),
                Report(zeros, reports[0].distances[:-1]),
                Report(zeros, (-1.0,) * len(reports[0].distances))):
        verdict = check_part(layout, 1, result, claims, {**reports, 0: bad})
        assert 0 in verdict.liars
    # a missing report is unknown within its bound under CenteredClip...
    verdict = check_part(layout, 1, result, claims, {**reports, 2: None})
    assert verdict.missing == {2} and verdict.status == "ok"
    # ... and unverifiable under the mean, where a term has no bound
    mean = Layout.for_tensors([37, 6000], [0.25] * 4, CodecPolicy(large="fp16", threshold=100),
                              1024, RULES["mean"])
    result, claims, decoded = reduce_part(mean, 1, rows, weights)
    reports = reports_for(mean, 1, result, claims, decoded, b"x" * 32)
    assert sketch_bound(claims, 2) is None
    assert check_part(mean, 1, result, claims, {**reports, 2: None}).status == "unverifiable"


@pytest.mark.parametrize("members", [3, 4, 8])
def test_a_reducer_covering_itself_is_caught_beyond_its_bound(members):
    """The reducer's own values count as a contributor's: it reports whatever
    sketch hides its shift, within its bound.  A shift far beyond the honest
    spread still shows, while its share is below 1 / (1 + NORM_SLACK)."""
    for seed in range(3):
        layout, rows, weights = scenario("centered_clip", "fp16", seed, n=members)
        for part in range(members):
            result, claims, decoded = reduce_part(layout, part, rows, weights)
            shifted = result + 5.0    # fifty times the honest values' spread
            reports = reports_for(layout, part, shifted, claims, decoded, b"y" * 32)
            others = [torch.tensor(r.sketch) for j, r in reports.items() if j != part]
            honest = torch.stack(others).sum(dim=0)
            bound = sketch_bound(claims, part)
            cover = -honest * min(1.0, 0.999 * bound / float(honest.norm()))
            reports[part] = Report(tuple(cover.tolist()), reports[part].distances)
            verdict = check_part(layout, part, shifted, claims, reports)
            assert verdict.status == "failed" and part not in verdict.liars, verdict


def _keystream(nonce: bytes, part: int, size: int) -> bytes:
    """The spec's keystream, from the spec's words."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = hashlib.shake_256(b"p2pdl/allreduce/verify/3" + bytes([len(GROUP)]) + GROUP
                            + part.to_bytes(2, "big") + nonce).digest(16)
    return Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(size))


def _spec_plan(nonce: bytes, part: int, numel: int) -> list[tuple[int, int]]:
    """Each value's bucket and sign, from the spec's words."""
    rows = -(-numel // SKETCH_BUCKETS)
    stream = _keystream(nonce, part, 32 + 2 * rows)
    plan = []
    for i in range(numel):
        row, column = divmod(i, SKETCH_BUCKETS)
        u = stream[32 + 2 * row] | stream[33 + 2 * row] << 8
        column_sign = 1 if stream[column // 8] >> (column % 8) & 1 else -1
        plan.append(((column + u) % SKETCH_BUCKETS,
                     (1 if u >> 8 & 1 else -1) * column_sign))
    return plan


def _plan_of(plan) -> list[tuple[int, int]]:
    """Each value's bucket and sign, from a SketchPlan."""
    out = []
    for i in range(plan.numel):
        row, column = divmod(i, SKETCH_BUCKETS)
        slot = int(plan.rows[row])
        sign = (1 if slot >= SKETCH_BUCKETS else -1) * int(plan.pattern[column])
        out.append(((column + slot) % SKETCH_BUCKETS, sign))
    return out


@pytest.mark.parametrize("numel", [1, 20, 255, 256, 257, 700])
def test_the_sketch_plan_is_fixed_bits_of_an_aes_keystream(numel):
    plan = sketch_plan(GROUP, 3, b"\x01" * 32, numel)
    assert _plan_of(plan) == _spec_plan(b"\x01" * 32, 3, numel)
    assert plan.rows.numel() == -(-numel // SKETCH_BUCKETS)
    assert _plan_of(sketch_plan(GROUP, 3, b"\x01" * 32, numel)) == _plan_of(plan)
    if numel >= 20:
        assert _plan_of(sketch_plan(GROUP, 3, b"\x02" * 32, numel)) != _plan_of(plan)
        assert _plan_of(sketch_plan(GROUP, 4, b"\x01" * 32, numel)) != _plan_of(plan)
    # a sketch is the signed sums per bucket
    values = torch.randn(numel, dtype=torch.float64)
    layout = Layout.for_tensors([numel], [1.0], CodecPolicy(), 1024, RULES["mean"])
    claim = [ChunkClaim((0,), (1.0,), None)]
    report = contributor_report(layout, 0, values.float(), torch.zeros(numel), claim, 0, plan)
    expected = [0.0] * SKETCH_BUCKETS
    for x, (bucket, sign) in zip(values.float().tolist(), _spec_plan(b"\x01" * 32, 3, numel),
                                 strict=True):
        expected[bucket] += x * sign
    assert report.sketch == pytest.approx(expected, abs=1e-5)


def test_a_sketch_keeps_the_norm_of_spread_and_constant_vectors():
    """Every value has its own sign: a vector that is the same in every row
    (a constant shift) keeps its norm like a random one, within a few percent
    for most nonces."""
    planner = SketchPlanner()
    vectors = {"random": torch.randn(65536), "constant": torch.ones(65536),
               "ramp": torch.linspace(-1, 1, 65536)}
    for name, vector in vectors.items():
        ratios = torch.tensor([
            torch.tensor(planner.sketch(planner.plan(GROUP, 0, k.to_bytes(4, "big"), 65536),
                                        vector)).norm() / vector.norm()
            for k in range(200)])
        assert abs(float(ratios.mean()) - 1) < 0.02, name
        assert float(ratios.std()) < 0.1, name
        assert float(ratios.min()) > 0.7 and float(ratios.max()) < NORM_SLACK, name
    # the rows' sums land where the values would one by one
    terms = torch.randn(100000)
    plan = planner.plan(GROUP, 0, b"\x00" * 32, 100000)
    assert planner.sketch(plan, terms) == pytest.approx(sketch(plan, terms), abs=1e-9)
    with pytest.raises(ValueError):
        planner.sketch(plan, terms[:10])
    assert sketch(sketch_plan(GROUP, 0, b"", 0), torch.zeros(0)) == (0.0,) * SKETCH_BUCKETS


def test_scratch_hands_out_buffers_again_and_keeps_a_bounded_number():
    scratch = Scratch()
    a, b = scratch.take(1000), scratch.take(10)
    assert a.dtype == torch.float32 and a.numel() == 1000 and b.numel() == 10
    scratch.give([a, b])
    assert scratch.nbytes == 4 * 1010
    again = scratch.take(500)   # the smallest free one large enough
    assert again.data_ptr() == a.data_ptr()
    assert scratch.take(5).data_ptr() == b.data_ptr()
    assert scratch.take(2000).numel() == 2000 and scratch.nbytes == 0   # none fits: a new one
    scratch.give([torch.empty(n + 1) for n in range(Scratch.MAX_FREE + 10)])
    assert len(scratch._free) == Scratch.MAX_FREE
    assert min(b.numel() for b in scratch._free) == 11   # the largest are kept


async def test_a_round_leaves_no_reference_cycle_and_reuses_its_buffers():
    """A finished round's session is freed as soon as the round returns, not
    by the cyclic garbage collector (which may run only rounds later: each
    round's vectors would pile up), and the next round's verification
    computes in the buffers the last one gave back."""
    import gc

    from p2pdl.averaging import AllReduceConfig
    from p2pdl.averaging.allreduce._session import _Session
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000),
                                 chunk_values=1024)
        await run_group(nodes, config, b"cycle-0", seed=1)   # a first round: the buffers
        scratch = nodes[0].allreduce._scratch
        before = {b.data_ptr() for b in scratch._free}
        assert before
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            await run_group(nodes, config, b"cycle-1", seed=2)
            assert {b.data_ptr() for b in scratch._free} == before
            gc.collect()
            assert not [o for o in gc.garbage if isinstance(o, _Session)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()


def test_norm64_is_the_float64_norm_and_decode_chunks_writes_where_asked():
    from p2pdl.averaging._norms import BLOCK_VALUES, WIDE_BLOCK_VALUES, norm64, norm_upper
    from p2pdl.averaging.allreduce._evidence import decode_chunks

    # Wider than one block of norm64's kept buffer, so it is reused within a call.
    x = torch.randn(WIDE_BLOCK_VALUES + 3 * BLOCK_VALUES + 17,
                    generator=torch.Generator().manual_seed(5))
    assert norm64(x) == pytest.approx(float(torch.linalg.vector_norm(x.double())), rel=1e-12)
    assert norm64(x[:5]) == pytest.approx(float(torch.linalg.vector_norm(x[:5].double())),
                                          rel=1e-12)
    x[:100] = 1e-6
    floored = torch.clamp(x.double().abs(), min=1e-3)
    assert norm64(x, floor=1e-3) == pytest.approx(float(torch.linalg.vector_norm(floored)),
                                                  rel=1e-12)
    assert norm64(torch.zeros(0)) == 0.0
    exact = float(torch.linalg.vector_norm(x.double()))
    assert exact <= norm_upper(x) <= exact * (1 + 2e-3)
    huge = torch.full((10,), 1e20)   # squares overflow float32: float64 then
    assert norm_upper(huge) == pytest.approx(math.sqrt(10) * float(huge[0]), rel=1e-12)
    from p2pdl.averaging import Float16Codec

    exact_bound = float(torch.linalg.vector_norm(Float16Codec().error_bound(x)))
    assert exact_bound <= Float16Codec().error_norm(x) <= math.sqrt(2) * exact_bound * 1.002
    layout = Layout.for_tensors([3000], [1.0], CodecPolicy(large="fp16", threshold=100), 1024,
                                RULES["mean"])
    payloads = [chunk.codec.encode(x[chunk.start:chunk.end]) for chunk in layout.chunks[0]]
    out = torch.full((3000,), 7.0)
    assert decode_chunks(layout, 0, payloads[:2], out=out) is out   # the third undelivered
    assert torch.equal(out, decode_chunks(layout, 0, payloads[:2]))
    assert torch.equal(out[2048:], torch.zeros(952))
    assert torch.allclose(out[:2048], x[:2048], atol=1e-2)


@pytest.mark.parametrize("codec", ["none", "fp16", "uint8"])
def test_own_payloads_are_read_without_a_copy_and_give_the_same_terms(codec):
    """A contributor's terms from views of its own payloads (fp16, none) or
    decoded copies (the others) are bit for bit those from its decoded values."""
    from p2pdl.averaging.allreduce._evidence import decode_chunks, own_chunk_values
    from p2pdl.averaging.allreduce._verify import contributor_terms

    gen = torch.Generator().manual_seed(7)
    layout = Layout.for_tensors([3000], [1.0], CodecPolicy(large=codec, threshold=100), 1024,
                                RULES["centered_clip"])
    x = torch.randn(3000, generator=gen) * 3
    payloads = [chunk.codec.encode(x[chunk.start:chunk.end].clone())
                for chunk in layout.chunks[0]]
    out = torch.full((3000,), 7.0)
    values = own_chunk_values(layout, 0, payloads[:2], out)   # the third undelivered
    views = [v for v in values if v.data_ptr() < out.data_ptr()
             or v.data_ptr() >= out.data_ptr() + 4 * 3000]
    assert len(views) == (2 if codec in ("none", "fp16") else 0)
    assert [v.dtype for v in views] == [{"none": torch.float32,
                                         "fp16": torch.float16}.get(codec)] * len(views)
    decoded = decode_chunks(layout, 0, payloads[:2])
    assert torch.equal(torch.cat([v.float() for v in values]), decoded)
    result = torch.randn(3000, generator=gen)
    claims = [ChunkClaim((0, 1, 2), (1.0, 1.0, 1.0), 0.8) for _ in layout.chunks[0]]
    flat_terms, flat_d = contributor_terms(layout, 0, decoded, result, claims, 0)
    terms, d = contributor_terms(layout, 0, values, result, claims, 0, out=out)
    assert terms is out and torch.equal(terms, flat_terms) and d == flat_d


def test_rules_without_a_check_are_unverifiable():
    layout = Layout.for_tensors([2000], [0.5, 0.5], CodecPolicy(), 1024, Aggregator("median"))
    rows = torch.randn(2, 2000, generator=torch.Generator().manual_seed(1))
    result, claims, decoded = reduce_part(layout, 0, rows, [1.0, 1.0])
    assert check_part(layout, 0, result, claims, {}).status == "unverifiable"


# -- on the wire: members check each other's results after the round ------------------


def lying_reducer(monkeypatch, liar: int, shift: float) -> None:
    """Member ``liar`` adds ``shift`` to every value of its part's results (its
    own copy too), after averaging them honestly: what every member receives."""
    from p2pdl.averaging.allreduce import _parts

    honest_finalize = _parts.PartReducer.finalize

    def finalize(self):
        done = honest_finalize(self)
        if self.me == liar:
            for k in done:
                chunk = self.chunks[k]
                lo = chunk.start - chunk.part_start
                out = self.sum[lo:lo + chunk.count]
                out.add_(shift)
                self.payloads[k] = chunk.result_codec.encode(out)
        return done

    monkeypatch.setattr(_parts.PartReducer, "finalize", finalize)


@pytest.mark.parametrize("codec", ["fp16", "topk", "qtopk"])
async def test_a_lying_reducer_is_caught_by_every_member_and_its_part_dropped(monkeypatch,
                                                                            codec):
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    config = AllReduceConfig(codecs=CodecPolicy(large=codec, threshold=1000), chunk_values=1024)
    lying_reducer(monkeypatch, 3, 10.0)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, xs = await run_group(nodes, config, b"liar")
        honest = [results[i] for i in range(3)]
        for me, result in enumerate(honest):
            part = result.parts[3]
            assert not part.completed and part.check == "failed", part
            assert 3 in result.disputed
            for r in range(3):
                if r != me:
                    assert result.parts[r].check == "ok", result.parts[r]
            stats = nodes[me].allreduce.statistics()
            assert stats["parts_check_failed"] == 1 and stats["parts_checked"] == 3
            # it disputed the part; the reducer's evidence did not clear it: banned
            assert stats["disputes_opened"] == 1 and stats["disputes_cleared"] == 0
            assert nodes[me].flags.count(nodes[3].peer_id, "reducer_lie") == 1
            assert nodes[me].flags.is_banned(nodes[3].peer_id, "run", time.time())
            for other in range(3):
                assert nodes[me].flags.count(nodes[other].peer_id) == 0
        # every honest member dropped the part alike: each keeps its own values there,
        # and the parts that passed are bit-identical
        lo, hi = honest[0].parts[3].start, honest[0].parts[3].end
        flats = [torch.cat([t.flatten() for t in r.tensors]) for r in honest]
        for i, f in enumerate(flats):
            own = torch.cat([t.flatten() for t in xs[i]])
            assert torch.equal(f[lo:hi], own[lo:hi])
            assert torch.equal(f[:lo], flats[0][:lo])


async def test_honest_rounds_pass_every_check_and_verify_off_sends_nothing():
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        for verify in (True, False):
            config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000),
                                     chunk_values=1024, verify=verify)
            results, _ = await run_group(nodes, config, b"honest-%d" % verify, seed=3)
            flats = [torch.cat([t.flatten() for t in results[i].tensors]) for i in range(4)]
            assert all(torch.equal(f, flats[0]) for f in flats)
            for i in range(4):
                checks = [p.check for r, p in enumerate(results[i].parts) if r != i]
                assert checks == (["ok"] * 3 if verify else [None] * 3)
        for node in nodes:
            stats = node.allreduce.statistics()
            assert stats["parts_checked"] == 3 and stats["parts_check_failed"] == 0
            assert node.flags.flagged("run") == {}


async def run_group(nodes, config, tag, seed=0):
    from .test_service import inputs, make_group

    group = make_group(nodes, tag=tag)
    xs = inputs(len(nodes), seed=seed)
    results = {}

    async def one(i):
        results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=config)

    async with trio.open_nursery() as nursery:
        for i in range(len(nodes)):
            nursery.start_soon(one, i)
    return results, xs


@pytest.mark.parametrize("lie", ["beyond_bound", "malformed"])
async def test_a_contributor_whose_report_is_a_lie_on_its_face_is_flagged_not_the_reducer(
        monkeypatch, lie):
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.averaging.allreduce import _verify
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    honest_reports = _verify.RoundVerifier.reports_for

    def reports_for(self, verifier, nonce, parts, digests):
        out = honest_reports(self, verifier, nonce, parts, digests)
        if self.me != 2:
            return out
        if lie == "beyond_bound":
            return [(r, d, Report((100.0,) * SKETCH_BUCKETS, rep.distances))
                    for r, d, rep in out]
        return [(r, d, Report((0.0,) * SKETCH_BUCKETS, (-1.0,) * len(rep.distances)))
                for r, d, rep in out]

    monkeypatch.setattr(_verify.RoundVerifier, "reports_for", reports_for)
    config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, _ = await run_group(nodes, config, b"lie-" + lie.encode())
        for i in (0, 1, 3):
            assert all(p.completed for p in results[i].parts)
            assert [p.check for r, p in enumerate(results[i].parts) if r != i] == ["ok"] * 3
            assert nodes[i].flags.count(nodes[2].peer_id, "report_beyond_bound") == 1
            assert nodes[i].allreduce.statistics()["reports_refused"] == 3 - (i == 2)
            for r in range(4):
                assert nodes[i].flags.count(nodes[r].peer_id, "reducer_check_failed") == 0


async def test_a_malformed_check_resets_the_exchange_and_changes_nothing(monkeypatch):
    """An ar.check naming a part twice is a protocol error: the stream is reset,
    the reports are not heard (unknown within their bound), the round ends."""
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.averaging.allreduce import _service
    from p2pdl.averaging.allreduce._messages import Check
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    honest_check = _service.AllReduceService._check

    def check(self, session, j, have, nonce):
        message = honest_check(self, session, j, have, nonce)
        if session.me == 1 and message.reports:
            return Check(message.group_id, message.sender,
                                  [message.reports[0], message.reports[0]])
        return message

    monkeypatch.setattr(_service.AllReduceService, "_check", check)
    config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, _ = await run_group(nodes, config, b"malformed-check")
        for i in (0, 2, 3):
            stats = nodes[i].allreduce.statistics()
            assert stats["protocol_errors"] == 1, (i, stats)
            # member 1's reports were not heard: unknown within their bound, the
            # honest results still pass
            assert all(p.completed for p in results[i].parts)
            assert [p.check for r, p in enumerate(results[i].parts) if r != i] == ["ok"] * 3


def test_a_joint_nonce_is_committed_closed_revealed_then_joined():
    from p2pdl.averaging.allreduce._verify import JointNonce, joint_nonce, nonce_commitment

    secrets_ = [bytes([i]) * 32 for i in range(4)]
    shares = [JointNonce(GROUP, i, secrets_[i]) for i in range(4)]
    assert shares[0].commitment == nonce_commitment(GROUP, 0, secrets_[0])
    assert shares[0].commitment != nonce_commitment(GROUP, 1, secrets_[0])   # bound to the member
    for a in shares:
        for b in shares:
            if a is not b:
                a.commit(b.me, b.commitment)
    assert all(s.committed([j for j in range(4) if j != s.me]) for s in shares)
    assert shares[0].close() == {1, 2, 3}
    shares[0].commit(1, b"\x00" * 32)            # a second commitment does not replace the first
    assert not shares[0].reveal(1, b"\x09" * 32)      # not the committed secret
    assert not shares[0].reveal(1, secrets_[1][:16])  # nor of the wrong size
    for a in shares:
        for b in shares:
            if a is not b:
                assert a.reveal(b.me, b.secret)
    assert all(s.revealed() for s in shares)
    nonces = {s.join() for s in shares}
    assert nonces == {joint_nonce(GROUP, dict(enumerate(secrets_)))}   # one nonce for all
    assert shares[0].withheld == frozenset()
    # A member that committed after the set closed does not count, revealed or not.
    late = JointNonce(GROUP, 0, secrets_[0])
    late.commit(1, shares[1].commitment)
    late.close()
    late.commit(2, shares[2].commitment)
    assert late.reveal(1, secrets_[1]) and late.reveal(2, secrets_[2])
    assert late.join() == joint_nonce(GROUP, {0: secrets_[0], 1: secrets_[1]})
    # One that never revealed: this member's secret alone (a nonce nobody else steers).
    lonely = JointNonce(GROUP, 0, secrets_[0])
    for j in (1, 2):
        lonely.commit(j, shares[j].commitment)
    lonely.reveal(1, secrets_[1])
    assert not lonely.revealed()
    lonely.gone.add(2)
    assert lonely.revealed() and lonely.withheld == {2}
    assert lonely.join() == joint_nonce(GROUP, {0: secrets_[0]})
    assert lonely.join() == lonely.nonce   # fixed


async def test_members_share_one_joint_nonce_so_each_part_is_sketched_once():
    """With no one withholding, every member's joint nonce is the same: a
    member sketches each part it contributed to once, not once per verifier."""
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000),
                                 chunk_values=1024)
        results, _ = await run_group(nodes, config, b"joint", seed=4)
        for i, node in enumerate(nodes):
            stats = node.allreduce.statistics()
            assert [p.check for r, p in enumerate(results[i].parts) if r != i] == ["ok"] * 3
            assert stats["reports_sketched"] == 4, stats   # one per part (its own included)
            assert stats["nonces_withheld"] == 0


async def honest_members_beside(monkeypatch, member_one, tag, seed):
    """Average a group of 4 in which member 1 runs ``member_one(honest,
    session, stream, j, theirs)`` instead of the exchange's verification
    (``honest``: the real one); each honest member's result, statistics and
    flags."""
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.averaging.allreduce import _exchange
    from p2pdl.testing import open_memory_nodes

    from .test_service import connect_all

    honest = _exchange._ExchangeSide._verify_pair

    async def verify_pair(self, session, stream, j, theirs):
        if session.me != 1:
            return await honest(self, session, stream, j, theirs)
        return await member_one(functools.partial(honest, self), session, stream, j, theirs)

    monkeypatch.setattr(_exchange._ExchangeSide, "_verify_pair", verify_pair)
    config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024,
                             sender_timeout=2.0, reducer_timeout=2.0)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, _ = await run_group(nodes, config, tag, seed=seed)
        return [(results[i], nodes[i].allreduce.statistics(), nodes[i].flags.flagged("run"))
                for i in (0, 2, 3)]


def honest_checks(result, i):
    return [p.check for r, p in enumerate(result.parts) if r != i]


@pytest.mark.parametrize("misbehaviour", ["wrong_secret", "withheld"])
async def test_a_member_that_reveals_a_false_secret_or_none_changes_no_verdict(
        monkeypatch, misbehaviour):
    """Member 1 reveals a secret that is not the one it committed to (a
    protocol error: the pair's exchange is reset) or none at all (the others
    wait JOIN_WAIT, then verify with nonces of their own secrets): every part
    still passes at the honest members, and nothing is flagged."""

    async def member_one(honest, session, stream, j, theirs):
        if misbehaviour == "withheld":
            await trio.sleep_forever()   # committed, never reveals: held until the deadline
        session.joint.secret = bytes(32)   # reveals another secret than the one committed to
        await honest(session, stream, j, theirs)

    honest = await honest_members_beside(monkeypatch, member_one,
                                         b"reveal-" + misbehaviour.encode(), 5)
    for i, (result, stats, flagged) in zip((0, 2, 3), honest, strict=True):
        assert all(p.completed for p in result.parts)
        assert honest_checks(result, i) == ["ok"] * 3
        if misbehaviour == "wrong_secret":
            assert stats["protocol_errors"] == 1, (i, stats)
        else:
            assert stats["nonces_withheld"] == 1, (i, stats)
        assert flagged == {}


@pytest.mark.parametrize("misbehaviour", ["short_joint", "check_first"])
async def test_an_exchange_out_of_its_order_is_reset_and_changes_no_verdict(
        monkeypatch, misbehaviour):
    """Member 1 sends a joint nonce of the wrong size, or its ar.check before
    its ar.reveal: each other member resets that pair's stream (a protocol
    error), does not hear member 1's reports, and every part still passes."""
    from p2pdl.averaging.allreduce._messages import Check, Joint, Reveal

    async def member_one(honest, session, stream, j, theirs):
        if misbehaviour == "check_first":
            await stream.send_message(Check(session.group.group_id, 1, []))
        else:
            await stream.send_message(Reveal(session.joint.secret))
            await stream.send_message(Joint(b"\x01" * 16))
        await trio.sleep_forever()   # held until the round's deadline

    honest = await honest_members_beside(monkeypatch, member_one,
                                         b"order-" + misbehaviour.encode(), 6)
    for i, (result, stats, flagged) in zip((0, 2, 3), honest, strict=True):
        assert stats["protocol_errors"] == 1, (i, stats)
        assert honest_checks(result, i) == ["ok"] * 3
        assert flagged == {}


def test_the_work_without_a_nonce_can_be_done_ahead_and_changes_nothing():
    """``RoundVerifier.prepare`` computes a member's terms of the parts it
    contributed to, then the result norms of the parts it checks, one part
    at a time; the reports and verdicts are those computed on demand, and
    ``check_part`` with the norms given is ``check_part`` without."""
    from p2pdl.averaging.allreduce._verify import JointNonce, RoundVerifier, result_norms

    layout, rows, weights = scenario("centered_clip", "fp16", 7)
    reduced = [reduce_part(layout, part, rows, weights) for part in range(len(weights))]
    me = 1

    def verifier() -> RoundVerifier:
        def values(r: int, own: torch.Tensor) -> torch.Tensor:
            return own.copy_(reduced[r][2][me])

        joint = JointNonce(GROUP, me, b"\x01" * 32)
        return RoundVerifier(layout, GROUP, me, joint,
                             {r: result for r, (result, _, _) in enumerate(reduced)},
                             {r: claims for r, (_, claims, _) in enumerate(reduced)},
                             {r: bytes([r]) * 32 for r in range(len(reduced))}, values)

    ahead, lazy = verifier(), verifier()
    assert list(ahead.prepare()) == [0, 1, 2, 3, 0, 2, 3]
    assert list(ahead.prepare()) == []   # done once
    parts, digests = [0, 1, 2, 3], [bytes([r]) * 32 for r in range(4)]
    for nonce in (ahead.nonce, b"\x07" * 32):
        assert ahead.reports_for(0, nonce, parts, digests) == \
            lazy.reports_for(0, nonce, parts, digests)
    for v in (ahead, lazy):
        for r in v.checked_parts:
            result, claims, decoded = reduced[r]
            heard = reports_for(layout, r, result, claims, decoded, v.nonce)
            for j, report in heard.items():
                if j != me:
                    v.hear_reports(j, [(r, bytes([r]) * 32, report)])
    assert ahead.verdicts() == lazy.verdicts()
    assert all(v.status == "ok" for v in ahead.verdicts().values())
    result, claims, decoded = reduced[2]
    reports = reports_for(layout, 2, result, claims, decoded, b"a" * 32)
    assert check_part(layout, 2, result, claims, reports, result_norms(layout, 2, result)) \
        == check_part(layout, 2, result, claims, reports)
    ahead.close()
    lazy.close()


@pytest.mark.parametrize("codec", ["none", "fp16"])
@pytest.mark.parametrize("apart", [0, 1, 3])
def test_contributors_a_few_ulps_apart_do_not_make_an_honest_radius_a_lie(codec, apart):
    """Two contributors whose values differ by rounding only (``apart`` units
    in the last place, or not at all): the distances to the result are what
    rounding makes them (one of the two may be 0), and the honest radius of
    ``tau="auto"`` (their distance) still passes."""
    gen = torch.Generator().manual_seed(apart)
    layout = Layout.for_tensors([37, 3000], [0.5, 0.5], CodecPolicy(large=codec, threshold=100),
                                1024, RULES["centered_clip"], caps=(0.5, 1.0))
    rows = torch.randn(1, 3037, generator=gen).repeat(2, 1)
    for _ in range(apart):
        rows[1] = torch.nextafter(rows[1], torch.tensor(math.inf))
    for part in range(2):
        result, claims, decoded = reduce_part(layout, part, rows, [8.0, 8.0])
        reports = reports_for(layout, part, result, claims, decoded, b"u" * 32)
        verdict = check_part(layout, part, result, claims, reports)
        assert verdict.status == "ok", (codec, apart, part, verdict)
