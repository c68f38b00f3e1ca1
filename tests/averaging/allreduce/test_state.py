"""The all-reduce's sans-IO parts: layout, reducer, receiver (no network)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdl.averaging import CodecPolicy, Layout, PartReceiver, PartReducer, get_codec
from p2pdl.averaging.allreduce import cap_shares
from p2pdl.averaging.allreduce._messages import Segment
from p2pdl.averaging.allreduce._parts import SenderState
from p2pdl.averaging.allreduce._state import MIN_CAPPED_CONTRIBUTORS, RejectError
from p2pdl.errors import RemoteProtocolError

EXACT = CodecPolicy(large="none")


def layout(sizes=(10, 25, 7), fractions=(0.5, 0.3, 0.2), chunk=8, policy=EXACT) -> Layout:
    return Layout.for_tensors(sizes, fractions, policy, chunk)


def test_layout_cuts_parts_at_fractions_and_chunks_at_tensor_boundaries():
    lay = layout()
    assert lay.numel == 42
    assert lay.part_bounds == ((0, 21), (21, 34), (34, 42))
    for part, chunks in enumerate(lay.chunks):
        lo, hi = lay.part_bounds[part]
        assert chunks[0].start == lo and chunks[-1].end == hi
        for a, b in zip(chunks, chunks[1:], strict=False):
            assert a.end == b.start
        for c in chunks:
            assert 0 < c.count <= 8
            # no chunk spans a tensor boundary (10 and 35)
            assert not (c.start < 10 < c.end) and not (c.start < 35 < c.end)


def test_layout_digest_covers_sizes_codecs_plan_and_chunk_size():
    base = layout().digest
    assert layout().digest == base
    assert layout(sizes=(10, 25, 8)).digest != base
    assert layout(fractions=(0.4, 0.4, 0.2)).digest != base
    assert layout(chunk=16).digest != base
    assert layout(policy=CodecPolicy(large="fp16", threshold=20)).digest != base


def test_codecs_follow_the_policy_by_tensor_size():
    lay = layout(sizes=(100, 10), fractions=(1.0,), policy=CodecPolicy(large="uint8",
                                                                      threshold=50))
    assert [c.codec.name for c in lay.chunks[0]] == ["uint8"] * 13 + ["none", "none"]


def test_zero_fraction_gets_an_empty_part():
    lay = layout(fractions=(0.5, 0.0, 0.5))
    assert lay.chunks[1] == ()
    assert lay.part_numel(0) + lay.part_numel(2) == 42


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6),
       weights=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5),
       chunk=st.integers(1, 64))
def test_layout_covers_the_vector_exactly_once(sizes, weights, chunk):
    if sum(weights) <= 0:
        weights = [1.0] + weights[1:]
    lay = Layout.for_tensors(sizes, weights, EXACT, chunk)
    covered = [c for part in lay.chunks for c in part]
    assert sum(c.count for c in covered) == sum(sizes)
    position = 0
    for c in covered:
        assert c.start == position and c.count > 0
        position = c.end


def make_reducer(lay, part=0, senders=(1, 2), local=None, weight=1.0, timeout=5.0,
                 max_share=0.5):
    numel = lay.part_numel(part)
    local = local if local is not None else torch.ones(numel)
    return PartReducer(lay, part, list(senders), local, weight, 0, now=0.0,
                       sender_timeout=timeout, max_share=max_share)


def feed(reducer, sender, values, now=1.0, upto=None):
    for chunk in reducer.chunks[:upto]:
        lo = chunk.start - chunk.part_start
        reducer.add_chunk(sender, chunk.header(), chunk.codec.encode(values[lo:lo + chunk.count]),
                          now)


def test_reducer_averages_by_weight_and_reports_contributors():
    lay = layout()
    reducer = make_reducer(lay)
    x1, x2 = torch.full((21,), 4.0), torch.full((21,), 10.0)
    reducer.begin(1, 3.0, True, 0.5)
    reducer.begin(2, 0.0, True, 0.5)  # weight 0: sends nothing, done at once
    assert reducer.finalize() == []
    feed(reducer, 1, x1)
    assert reducer.finalize() == list(range(len(reducer.chunks)))
    assert reducer.complete
    assert torch.allclose(reducer.result(), torch.full((21,), (1 * 1 + 3 * 4) / 4))
    assert [(s.first, s.end, s.contributors, s.weight) for s in reducer.segments()] == [
        (0, len(reducer.chunks), [0, 1], 4.0)]
    del x2


def test_chunks_become_final_in_order_as_every_sender_delivers_them():
    lay = layout()
    reducer = make_reducer(lay)
    reducer.begin(1, 1.0, True, 0.0)
    reducer.begin(2, 1.0, True, 0.0)
    values = torch.arange(21, dtype=torch.float32)
    feed(reducer, 1, values)
    assert reducer.finalize() == []
    feed(reducer, 2, values, upto=1)
    assert reducer.finalize() == [0]
    assert reducer.final == 1 and not reducer.complete


def test_a_silent_sender_is_excluded_after_sender_timeout_and_the_rest_is_averaged():
    lay = layout()
    reducer = make_reducer(lay, timeout=5.0)
    reducer.begin(1, 1.0, True, 0.0)
    reducer.begin(2, 1.0, True, 0.0)
    feed(reducer, 1, torch.full((21,), 3.0), now=1.0)
    feed(reducer, 2, torch.full((21,), 5.0), now=1.0, upto=1)
    assert reducer.check_timeouts(4.0) == []
    assert reducer.next_deadline() == pytest.approx(6.0)
    assert reducer.check_timeouts(6.0) == [2]
    assert reducer.sender_states()[2] is SenderState.EXCLUDED
    reducer.finalize()
    assert reducer.complete
    first = reducer.chunks[0]
    assert torch.allclose(reducer.result()[:first.count], torch.full((first.count,), 3.0))
    assert torch.allclose(reducer.result()[first.count:], torch.full((21 - first.count,), 2.0))
    assert [s.contributors for s in reducer.segments()] == [[0, 1, 2], [0, 1]]
    with pytest.raises(RejectError) as info:
        reducer.begin(2, 1.0, True, 7.0)
    assert info.value.code == "excluded"


def test_a_sender_that_never_begins_is_excluded_too():
    reducer = make_reducer(layout(), senders=(1,), timeout=2.0)
    assert reducer.check_timeouts(2.0) == [1]
    reducer.finalize()
    assert reducer.complete and torch.equal(reducer.result(), torch.ones(21))


@pytest.mark.parametrize("problem", ["place", "size", "codec", "nan", "extra"])
def test_a_bad_chunk_is_a_remote_protocol_error(problem):
    lay = layout()
    reducer = make_reducer(lay, senders=(1,))
    reducer.begin(1, 1.0, True, 0.0)
    chunk = reducer.chunks[0]
    header, payload = chunk.header(), bytes(chunk.codec.encode(torch.ones(chunk.count)))
    if problem == "place":
        header = type(header)(header.part, "float32", header.shape, header.offset + 1,
                              header.count)
    elif problem == "size":
        payload = payload[:-4]
    elif problem == "codec":
        header = type(header)(header.part, "float32", header.shape, header.offset,
                              header.count, "fp16")
    elif problem == "nan":
        payload = bytes(chunk.codec.encode(torch.ones(chunk.count)))
        payload = payload[:-4] + torch.tensor([float("nan")]).numpy().tobytes()
    elif problem == "extra":
        feed(reducer, 1, torch.ones(21))
        reducer.senders[1].state = SenderState.STREAMING  # as if it went on sending
    with pytest.raises(RemoteProtocolError):
        reducer.add_chunk(1, header, payload, 1.0)


def test_nothing_is_nan_when_nobody_has_weight():
    lay = layout()
    local = torch.full((21,), 7.0)
    reducer = make_reducer(lay, senders=(1,), local=local, weight=0.0)
    reducer.begin(1, 0.0, True, 0.0)
    reducer.finalize()
    assert reducer.complete and torch.equal(reducer.result(), local)
    assert reducer.segments()[0].contributors == []


def test_begin_checks_membership_and_duplicates():
    reducer = make_reducer(layout(), senders=(1,))
    with pytest.raises(RejectError) as info:
        reducer.begin(5, 1.0, True, 0.0)
    assert info.value.code == "not_member"
    reducer.begin(1, 1.0, True, 0.0)
    with pytest.raises(RejectError) as info:
        reducer.begin(1, 1.0, True, 0.0)
    assert info.value.code == "duplicate"


def test_a_lossy_codec_gives_the_reducer_the_same_values_as_everyone():
    lay = layout(sizes=(300,), fractions=(1.0, 0.0), chunk=64,
                 policy=CodecPolicy(large="fp16", threshold=10))
    values = torch.randn(300)
    reducer = make_reducer(lay, senders=(1,), local=values.clone())
    reducer.begin(1, 1.0, True, 0.0)
    feed(reducer, 1, values * 3)
    reducer.finalize()
    out = torch.zeros(300)
    receiver = PartReceiver(lay, 0, out, 2)
    for chunk, payload in zip(reducer.chunks, reducer.payloads, strict=True):
        receiver.add_chunk(chunk.header(), payload)
    receiver.done(reducer.segments())
    assert receiver.complete
    assert torch.equal(out, reducer.result())
    bound = get_codec("fp16").max_abs_error(values * 3) * 2 + 1e-6
    assert float((out - values * 2).abs().max()) <= bound


def test_receiver_checks_order_count_and_segments():
    lay = layout()
    out = torch.zeros(21)
    receiver = PartReceiver(lay, 0, out, 3)
    chunks = lay.chunks[0]
    with pytest.raises(RemoteProtocolError):
        receiver.add_chunk(chunks[1].header(), chunks[1].codec.encode(torch.ones(chunks[1].count)))
    for c in chunks:
        receiver.add_chunk(c.header(), c.codec.encode(torch.ones(c.count)))
    with pytest.raises(RemoteProtocolError):
        receiver.done([Segment(0, 1, [0], 1.0)])  # does not cover every chunk
    with pytest.raises(RemoteProtocolError):
        receiver.done([Segment(0, len(chunks), [7], 1.0)])  # not a member
    with pytest.raises(RemoteProtocolError):
        receiver.done([Segment(0, len(chunks), [1, 0], 1.0)])  # not ascending
    receiver.done([Segment(0, len(chunks), [0, 1], 2.0)])
    assert receiver.complete and torch.equal(out, torch.ones(21))


# -- weights: evidence bounds and the share cap -----------------------------------------


def test_cap_shares_lowers_only_what_is_above_the_share():
    assert cap_shares([1.0, 3.0, 5.0], 0.5) == [1.0, 3.0, 4.0]        # 5 of 9 -> 4 of 8
    assert cap_shares([2.0**31, 100.0, 200.0], 0.5) == [300.0, 100.0, 200.0]
    assert cap_shares([10.0, 10.0, 1.0, 1.0], 0.25) == [1.0, 1.0, 1.0, 1.0]  # 1/n: all equal
    assert cap_shares([9.0, 9.0, 1.0, 1.0], 0.4) == pytest.approx([4.0, 4.0, 1.0, 1.0])
    assert cap_shares([100.0, 1.0], 0.5) == [100.0, 1.0]          # fewer than 3: unchanged
    assert cap_shares([100.0, 1.0, 0.0, 0.0], 0.5) == [100.0, 1.0, 0.0, 0.0]
    assert cap_shares([100.0, 1.0, 1.0], 1.0) == [100.0, 1.0, 1.0]  # 1 disables it


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 2.0**40)), min_size=1,
                        max_size=12),
       share=st.floats(0.05, 1.0))
def test_cap_shares_keeps_every_share_within_the_cap(weights, share):
    capped = cap_shares(weights, share)
    positive = sum(1 for w in weights if w > 0)
    assert len(capped) == len(weights)
    assert all(0 <= c <= w for c, w in zip(capped, weights, strict=True))
    assert [c > 0 for c in capped] == [w > 0 for w in weights]
    if positive >= MIN_CAPPED_CONTRIBUTORS:
        limit = max(share, 1 / positive)
        total = sum(capped)
        assert max(capped) <= limit * total * (1 + 1e-9)
        # nobody below the cap is touched, and those capped share one value
        top = max(capped)
        assert all(c == w for c, w in zip(capped, weights, strict=True) if w < top)
    else:
        assert capped == weights


def test_a_weight_is_capped_at_its_bound_and_the_segment_says_what_counted():
    reducer = make_reducer(layout(), senders=(1, 2), weight=2.0)
    reducer.begin(1, 2.0**31, True, 0.0, bound=3.0)
    reducer.begin(2, 1.0, True, 0.0, bound=None)
    feed(reducer, 1, torch.full((21,), -8.0))
    feed(reducer, 2, torch.full((21,), 4.0))
    reducer.finalize()
    assert reducer.senders[1].claimed == 2.0**31 and reducer.senders[1].weight == 3.0
    # 2 * 1 + 3 * -8 + 1 * 4 over 6: the bound holds, and 3 of 6 is within the share cap
    assert torch.allclose(reducer.result(), torch.full((21,), (2 - 24 + 4) / 6))
    assert {(tuple(s.contributors), s.weight) for s in reducer.segments()} == {((0, 1, 2), 6.0)}


def test_a_bound_of_zero_drops_the_senders_values():
    reducer = make_reducer(layout(), senders=(1,))
    reducer.begin(1, 5.0, True, 0.0, bound=0.0)
    assert not reducer.accepts_chunks(1)   # its chunks are read and dropped
    reducer.finalize()
    assert reducer.complete and torch.equal(reducer.result(), torch.ones(21))
    assert reducer.segments()[0].contributors == [0]


def test_the_share_cap_counts_each_chunk_over_exactly_its_contributors():
    # 1 inflates; 2 claims as much and fails before sending anything, so that it
    # cannot lift the cap of 1 in the chunks it did not deliver.
    lay = layout()
    reducer = make_reducer(lay, senders=(1, 2, 3), weight=1.0, local=torch.zeros(21))
    reducer.begin(1, 1000.0, True, 0.0)
    reducer.begin(2, 1000.0, True, 0.0)
    reducer.begin(3, 1.0, True, 0.0)
    reducer.fail(2, "gone")
    feed(reducer, 1, torch.full((21,), 10.0))
    feed(reducer, 3, torch.full((21,), 0.0))
    reducer.finalize()
    # weights 1, 1000, 1 -> 1, 2, 1: member 1 holds exactly half of every chunk
    assert torch.allclose(reducer.result(), torch.full((21,), 5.0))
    assert reducer.share_capped == {1}
    assert {s.weight for s in reducer.segments()} == {4.0}


def test_the_average_does_not_depend_on_the_order_chunks_arrive_in():
    lay = layout(sizes=(40,), fractions=(1.0,), chunk=8)
    gen = torch.Generator().manual_seed(3)
    values = {s: torch.randn(40, generator=gen) for s in (1, 2, 3)}
    results = []
    for order in ((1, 2, 3), (3, 1, 2), (2, 3, 1)):
        reducer = make_reducer(lay, senders=(1, 2, 3), weight=0.7,
                               local=torch.randn(40, generator=torch.Generator().manual_seed(4)))
        for s in order:
            reducer.begin(s, 0.3 * s, True, 0.0)
        for s in order:
            feed(reducer, s, values[s])
        reducer.finalize()
        results.append(reducer.result().clone())
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def feed_next(reducer, sender, now):
    chunk = reducer.chunks[reducer.senders[sender].next_chunk]
    reducer.add_chunk(sender, chunk.header(), chunk.codec.encode(torch.ones(chunk.count)), now)


def test_a_sender_ahead_is_held_back_and_its_clock_restarts_when_it_is_waited_for():
    lay = layout(sizes=(64,), fractions=(1.0,), chunk=8)   # 8 chunks
    reducer = PartReducer(lay, 0, [1, 2], torch.zeros(64), 1.0, 0, now=0.0,
                          sender_timeout=5.0, max_ahead=2)
    reducer.begin(1, 1.0, True, 0.0)
    reducer.begin(2, 1.0, True, 0.0)
    feed_next(reducer, 1, 1.0)
    feed_next(reducer, 1, 1.0)
    assert not reducer.wants_chunk(1) and reducer.wants_chunk(2)  # 1 is 2 past chunk 0
    assert reducer.next_deadline() == pytest.approx(5.0)           # only 2 is waited for
    assert reducer.check_timeouts(4.9) == []
    feed_next(reducer, 2, 4.9)                                      # chunk 0 is in
    assert reducer.finalize() == [0]
    assert reducer.wants_chunk(1) and reducer.wants_chunk(2)
    assert reducer.next_deadline() == pytest.approx(9.9)
    feed_next(reducer, 2, 8.0)
    # 1 was held back since t=1 and is waited for from t=8: not excluded at once
    assert reducer.check_timeouts(8.0) == []
    assert reducer.next_deadline() == pytest.approx(13.0)
    assert reducer.check_timeouts(13.0) == [1, 2]
    reducer.finalize()
    assert reducer.complete
