"""p2pdl.training._rounds: starting, waiting for and judging rounds, on a fake node."""

from __future__ import annotations

import concurrent.futures
import time
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdl.averaging import AllReduceConfig, CodecPolicy, QTopKCodec, TopKCodec, get_codec
from p2pdl.errors import CallTimeoutError, ConfigError, MatchmakingFailedError
from p2pdl.training import OptimizerConfig, Rounds
from p2pdl.training._rounds import ErrorFeedback, clear_incomplete

from .fake_node import FakeNode, FakeTracker, averaged, progress

pytestmark = pytest.mark.timeout(30)


def rounds(node: FakeNode | None = None, **options: object) -> Rounds:
    return Rounds(node or FakeNode(), "run", OptimizerConfig(**options))


def done(value: object) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


def test_a_round_is_started_with_the_configured_options():
    node = FakeNode()
    allreduce = AllReduceConfig()
    r = rounds(node, matchmaking_time=3.0, target_group_size=4, bandwidth=1e6, reduce_rate=2e6,
               allreduce=allreduce)
    tensors = [torch.zeros(2)]
    r.start(5, tensors, 12)
    (call,) = node.allreduce.calls
    assert call == {"run_id": "run", "epoch": 5, "tensors": tensors, "weight": 12.0,
                    "config": allreduce, "inplace": True, "on_group": None,
                    "auxiliary": False, "matchmaking_time": 3.0, "target_group_size": 4,
                    "bandwidth": 1e6, "reduce_rate": 2e6}
    assert isinstance(call["weight"], float)


def test_judging_an_averaged_a_partial_and_a_failed_round():
    r = rounds()
    sent = [torch.ones(2)]
    back = [torch.full((2,), 3.0)]
    result = r.judge(1, sent, 8, averaged(back, members=3), 0.5)
    assert result.averaged is back and result.sent is sent
    assert (result.info.outcome, result.info.group_size, result.info.samples) == ("averaged", 3, 8)
    partial = r.judge(2, sent, 8, averaged(back, incomplete=(1,)), 0.5)
    assert partial.info.outcome == "partial" and partial.averaged is back
    assert partial.info.error == "parts [1] incomplete"
    failed = r.judge(3, sent, 8, MatchmakingFailedError("nobody came"), 0.5)
    assert failed.info.outcome == "failed" and failed.averaged is None
    assert failed.info.group_size == 1 and failed.info.error == "nobody came"
    assert r.statistics() == {"rounds": 0, "averaged": 1, "partial": 1, "alone": 0, "failed": 1}
    # the history: every judged round, with the members whose values this peer's part took
    assert [i.epoch for i in r.history] == [1, 2, 3]
    assert len(r.history[0].contributors) == 3 and r.history[2].contributors == ()


def test_a_part_that_did_not_complete_is_no_update_on_every_member():
    """A part whose reducer died kept each member's own values: they would differ
    from member to member.  Zeros are the same everywhere: no update for them."""
    r = rounds()
    # 9 values over two tensors; the parts are values [0, 3), [3, 6), [6, 9)
    a, b = torch.arange(1.0, 5.0), torch.arange(5.0, 10.0).view(5, 1)
    partial = r.judge(2, [a, b], 8, averaged([a, b], incomplete=(1,)), 0.5)
    assert partial.info.outcome == "partial"
    assert a.tolist() == [1.0, 2.0, 3.0, 0.0] and b.flatten().tolist() == [0, 0, 7, 8, 9]
    # another member that lost the same part ends with the same zeros there
    other = [torch.arange(11.0, 15.0), torch.arange(15.0, 20.0).view(5, 1)]
    r.judge(2, other, 8, averaged(other, incomplete=(1,)), 0.5)
    assert other[0][3] == 0 and bool((other[1][:2] == 0).all())
    # a complete round changes nothing; several parts clear all of theirs
    whole = [torch.ones(9)]
    assert clear_incomplete(whole, averaged(whole).parts) == 0 and whole[0].sum() == 9
    assert clear_incomplete(whole, averaged(whole, incomplete=(0, 2)).parts) == 6
    assert whole[0].tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0]


def test_contributors_leave_out_the_members_this_peers_reducer_excluded():
    r = rounds()
    result = averaged([torch.ones(2)], members=3, excluded=(1,))
    ids = [m.peer_id.to_base58() for m in result.group.members]
    info = r.judge(4, [torch.ones(2)], 8, result, 0.1).info
    assert info.contributors == (ids[0], ids[2])


def test_run_waits_for_the_round_and_alone_takes_its_own_values():
    node = FakeNode()
    back = [torch.full((2,), 3.0)]
    node.allreduce.futures.append(done(averaged(back)))
    r = rounds(node)
    sent = [torch.ones(2)]
    result = r.run(0, sent, 4, alone=False)
    assert result.info.outcome == "averaged" and result.averaged is back
    alone = r.run(1, sent, 4, alone=True)
    assert alone.info.outcome == "alone" and alone.averaged is sent
    assert len(node.allreduce.calls) == 1   # no round for a peer alone
    assert r.statistics() == {"rounds": 2, "averaged": 1, "partial": 0, "alone": 1, "failed": 0}


def test_waiting_past_the_limit_cancels_the_round_and_errors_are_returned():
    node = FakeNode()
    node.allreduce.limit = 0.05
    r = rounds(node)
    hanging: concurrent.futures.Future = concurrent.futures.Future()
    outcome = r.wait(hanging)
    assert isinstance(outcome, CallTimeoutError) and hanging.cancelled()
    error = MatchmakingFailedError("no group")
    assert r.wait(done(error)) is error
    with pytest.raises(KeyError):   # not a p2pdl error: a bug, raised
        r.wait(done(KeyError("bug")))


def test_a_background_round_matches_until_its_group_forms_then_finishes():
    node = FakeNode()
    r = rounds(node)
    sent = [torch.ones(2)]
    r.start_background(7, sent, 16)
    assert r.pending is not None and r.pending.epoch == 7 and r.matching()
    assert r.finish(block=False) is None   # still running
    node.allreduce.calls[0]["on_group"](object())   # the node's thread: the group formed
    assert not r.matching()
    back = [torch.full((2,), 2.0)]
    r.pending.future.set_result(averaged(back))
    result = r.finish(block=False)
    assert result is not None and result.info.epoch == 7 and result.averaged is back
    assert r.pending is None and r.finish(block=True) is None
    r.start_background(8, sent, 16)
    future = r.pending.future
    r.drop()
    assert future.cancelled() and r.pending is None and not r.matching()


def test_alone_counts_trainers_and_discovery_waits_for_the_others():
    r = rounds(discovery_time=60.0)
    assert r.alone(progress(num_peers=2, num_auxiliary=1))
    assert not r.alone(progress(num_peers=3, num_auxiliary=1))
    assert r.discovering()   # started a moment ago
    assert not rounds(discovery_time=0).discovering()
    quick = rounds(discovery_time=0.05)
    time.sleep(0.1)
    assert not quick.discovering()
    quick.observe(progress(num_peers=2))   # another trainer: the clock starts again
    assert quick.discovering()


def test_an_auxiliary_peer_follows_the_epoch_joins_once_per_epoch():
    node = FakeNode()
    tracker = FakeTracker(view=[progress(2, ready=True)])
    node.allreduce.futures.append(done(averaged([torch.zeros(3)], members=3)))
    r = rounds(node, auxiliary=True, ready_timeout=0.3)
    params = [torch.ones(3, dtype=torch.float16)]
    epoch, info = r.assist(tracker, 0, params)
    assert epoch == 2 and tracker.epochs == [2]   # followed the trainers first
    assert info is not None and info.outcome == "averaged" and info.group_size == 3
    (call,) = node.allreduce.calls
    assert call["auxiliary"] is True and call["weight"] == 0.0 and call["epoch"] == 2
    assert call["tensors"][0].dtype == torch.float32 and not call["tensors"][0].any()
    again = r.assist(tracker, 2, params)   # this epoch's round is done: wait for the next
    assert again == (2, None) and len(node.allreduce.calls) == 1
    not_ready = rounds(node, auxiliary=True, ready_timeout=0.05)
    assert not_ready.assist(FakeTracker(view=[progress(2)]), 2, params) == (2, None)


def test_an_auxiliary_round_that_fails_is_reported():
    node = FakeNode()
    node.allreduce.futures.append(done(MatchmakingFailedError("alone")))
    r = rounds(node, auxiliary=True, ready_timeout=1.0)
    epoch, info = r.assist(FakeTracker(view=[progress(0, ready=True)]), 0, [torch.ones(1)])
    assert epoch == 0 and info is not None and info.outcome == "failed"
    assert r.statistics()["failed"] == 1 and r.statistics()["rounds"] == 1


class PublishingTracker(FakeTracker):
    """A tracker that can publish its report at once, recording when it did."""

    def __init__(self, node: FakeNode) -> None:
        super().__init__()
        self.node = node
        self.published: list[int] = []   # rounds started before each publish

    def publish_now(self) -> None:
        self.published.append(len(self.node.allreduce.calls))


def test_a_round_with_samples_publishes_the_report_that_backs_its_weight_first():
    node = FakeNode()
    tracker = PublishingTracker(node)
    r = Rounds(node, "run", OptimizerConfig(), tracker=tracker)
    r.start(3, [torch.zeros(2)], 12)
    assert tracker.published == [0]   # before the round was started
    r.start(4, [torch.zeros(2)], 0)    # no samples: no weight to back
    r.start(4, [torch.zeros(2)], 0, auxiliary=True)
    assert tracker.published == [0] and len(node.allreduce.calls) == 3


def test_rounds_without_a_tracker_start_without_publishing():
    node = FakeNode()
    r = Rounds(node, "run", OptimizerConfig())
    r.start(3, [torch.zeros(2)], 12)
    assert node.allreduce.calls[0]["weight"] == 12.0


# -- error feedback ----------------------------------------------------------------------


def test_error_feedback_is_on_with_a_lossy_codec_or_when_asked():
    lossy = AllReduceConfig(codecs=CodecPolicy(large="uint4"))
    assert rounds(allreduce=lossy).feedback is not None
    assert rounds(allreduce=AllReduceConfig(codecs=CodecPolicy(small="uint8"))).feedback \
        is not None
    assert rounds(allreduce=AllReduceConfig()).feedback is None          # fp16
    assert rounds().feedback is None                  # the fake node says no config
    assert rounds(error_feedback=True).feedback is not None
    assert rounds(allreduce=lossy, error_feedback=False).feedback is None
    with pytest.raises(ConfigError):
        OptimizerConfig(error_feedback="yes")


def test_a_rounds_rounding_is_sent_with_the_next_round():
    """Round 1 asks for the sent error; round 2 sends its values plus it (new
    tensors); a failed round, or a step alone, clears it."""
    node = FakeNode()
    r = rounds(node, error_feedback=True)
    first = [torch.ones(3)]
    error = [torch.tensor([0.25, -0.5, 0.0])]
    node.allreduce.futures.append(done(SimpleNamespace(**vars(averaged([torch.ones(3)])),
                                                       sent_error=error)))
    r.run(1, first, 8, alone=False)
    assert node.allreduce.calls[0]["sent_error"] is True
    assert torch.equal(node.allreduce.calls[0]["tensors"][0], torch.ones(3))
    node.allreduce.futures.append(done(MatchmakingFailedError("nobody")))
    second = [torch.ones(3)]
    result = r.run(2, second, 8, alone=False)
    sent = node.allreduce.calls[1]["tensors"]
    assert torch.equal(sent[0], torch.tensor([1.25, 0.5, 1.0])) and sent[0] is not second[0]
    assert torch.equal(second[0], torch.ones(3))      # the caller's tensors are left alone
    assert result.sent is sent                        # a failed round steps with these
    third = [torch.ones(3)]
    node.allreduce.futures.append(done(averaged([torch.ones(3)])))
    r.run(3, third, 8, alone=False)
    assert torch.equal(node.allreduce.calls[2]["tensors"][0], torch.ones(3))  # cleared
    r.feedback.keep(error)
    assert torch.equal(r.run(4, [torch.ones(3)], 8, alone=True).sent[0],
                       torch.tensor([1.25, 0.5, 1.0]))
    assert r.feedback.residual is None


def test_with_diloco_fragments_each_fragments_rounding_goes_to_its_own_next_round():
    """fragments=2: epochs 0, 2, 4 average fragment 0 and 1, 3 fragment 1; a
    round's residual is added to the next round of its fragment, not the next
    round (which may even have the same shapes)."""
    node = FakeNode()
    r = rounds(node, error_feedback=True, mode="diloco", fragments=2)
    errors = {0: [torch.tensor([0.25, 0.0, 0.0])], 1: [torch.tensor([0.0, 0.5, 0.0])]}
    for epoch in (0, 1):
        node.allreduce.futures.append(done(SimpleNamespace(
            **vars(averaged([torch.ones(3)])), sent_error=errors[epoch])))
        r.run(epoch, [torch.ones(3)], 8, alone=False)
    for epoch in (2, 3):
        node.allreduce.futures.append(done(averaged([torch.ones(3)])))
        r.run(epoch, [torch.ones(3)], 8, alone=False)
        sent = node.allreduce.calls[epoch]["tensors"][0]
        assert torch.equal(sent, torch.ones(3) + errors[epoch % 2][0]), epoch


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["uint4", "uint8", "fp16", "topk", "qtopk"]), st.integers(1, 6),
       st.integers(1, 600), st.integers(0, 2**16))
def test_error_feedback_loses_nothing_but_the_last_rounding(codec_name, count, numel, seed):
    """Over rounds, what the reducers decoded plus the residual is what was given:
    sum(decoded) + residual == sum(inputs), up to float32 rounding (topk: what
    it dropped is the residual's)."""
    codec = TopKCodec(7, 2) if codec_name == "topk" else QTopKCodec(7, 2) \
        if codec_name == "qtopk" else get_codec(codec_name, 7 if codec_name != "fp16" else None)
    gen = torch.Generator().manual_seed(seed)
    feedback = ErrorFeedback()
    given_sum = torch.zeros(numel, dtype=torch.float64)
    decoded_sum = torch.zeros(numel, dtype=torch.float64)
    scale = 0.0
    for _ in range(count):
        x = torch.randn(numel, generator=gen) * float(torch.rand(1, generator=gen) * 10)
        (sent,) = feedback.compensate([x])
        decoded = codec.decode(codec.encode(sent), numel)
        feedback.keep([sent - decoded])
        given_sum += x.double()
        decoded_sum += decoded.double()
        scale = max(scale, float(sent.abs().max()))
    total = decoded_sum + feedback.residual[0].double()
    assert float((total - given_sum).abs().max()) <= 4 * count * scale * 2.0**-23 + 1e-30
    # without feedback the rounding adds up; with it, the error stays one rounding
    assert float((decoded_sum - given_sum).abs().max()) \
        <= codec.max_abs_error(sent) * 1.001 + 4 * count * scale * 2.0**-23 + 1e-30
