"""A sender's weight is bounded: by what its own progress reports support (the
node's ``ProgressService.weight_evidence``, faked here; the real one with the
report a sender attaches to its ``ar.begin`` is in test_weight_evidence.py)
and by the share cap.

A weight-inflating member claims ``2**31`` samples and sends flipped values
(minus the honest mean); in-memory nodes, virtual time.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import trio

from p2pdl import NodeConfig
from p2pdl.averaging import Aggregator, AllReduceConfig, CodecPolicy, Layout, PartReducer
from p2pdl.progress import ProgressService
from p2pdl.testing import open_memory_nodes

from .test_service import connect_all, inputs, make_group, max_error, run_all, weighted_mean

#: These tests check the weighted mean (the default rule is CenteredClip).
MEAN = Aggregator()

pytestmark = pytest.mark.timeout(120)

EXACT = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"), chunk_values=1024,
                        averaging_timeout=60.0)
INFLATED = float(2**31)
SLACK = EXACT.weight_slack
SLACK_SAMPLES = EXACT.weight_slack_samples


def with_evidence(monkeypatch, samples):
    """Every node's progress service says ``samples[peer]`` (None: no evidence),
    and records what it was asked (the nodes track no run: no report is attached)."""
    asked = []

    def weight_evidence(self, run_id, peer, epoch, report=None):
        assert report is None
        asked.append((run_id, peer, epoch))
        return samples(peer)

    monkeypatch.setattr(ProgressService, "weight_evidence", weight_evidence, raising=False)
    return asked


def attack_inputs(count, weights, attacker):
    """Honest members' tensors, and the attacker's: minus the honest weighted mean."""
    xs = inputs(count)
    honest = [i for i in range(count) if i != attacker]
    mean = weighted_mean(xs, weights, honest)
    xs[attacker] = [-t for t in mean]
    return xs, mean


def bound(samples):
    return samples * (1 + SLACK) + SLACK_SAMPLES


def same_everywhere(results):
    first = next(iter(results.values()))
    for result in results.values():
        for a, b in zip(result.tensors, first.tensors, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("count", [3, 4])
async def test_an_inflated_weight_is_capped_at_its_evidence(count, monkeypatch, autojump_clock):
    samples = {}
    asked = with_evidence(monkeypatch, samples.get)
    async with open_memory_nodes(count) as nodes:
        await connect_all(nodes)
        attacker = count - 1
        samples.update({n.peer_id: 100 * (i + 1) for i, n in enumerate(nodes)})
        samples[nodes[attacker].peer_id] = 100   # what its signed reports say
        # The attacker is in client mode: it reduces no part, so every part is
        # reduced by an honest member (a reducer's own part is its to corrupt).
        group = make_group(nodes, clients={attacker})
        weights = [100.0 * (i + 1) for i in range(count - 1)] + [INFLATED]
        xs, honest_mean = attack_inputs(count, weights, attacker)
        results = await run_all(nodes, group, xs, weights, EXACT)
        counted = weights[:-1] + [bound(100)]
        truth = weighted_mean(xs, counted, range(count))
        for result in results.values():
            assert result.completed
            assert max_error(result.tensors, truth) < 1e-6
        same_everywhere(results)
        # The honest mean still points the way: the attacker counts as a peer of
        # 100 samples (and the slack) that sends the flipped mean, so what is
        # left is (H - b) / (H + b) of it, not minus all of it.
        flat = torch.cat([t.reshape(-1) for t in results[0].tensors])
        mean = torch.cat([t.reshape(-1) for t in honest_mean])
        honest = sum(weights[:-1])
        left = (honest - bound(100)) / (honest + bound(100))
        assert left > 0.2
        assert float(flat @ mean) / float(mean @ mean) == pytest.approx(left, rel=1e-4)
        for i in range(count - 1):
            stats = nodes[i].allreduce.statistics()
            assert stats["weights_capped"] == 1
            assert nodes[i].flags.count(nodes[attacker].peer_id, "weight_beyond_evidence") == 1
            (flag,) = nodes[i].flags.flags_of(nodes[attacker].peer_id)
            assert flag.run_id == "run" and "2.14748e+09" in flag.detail
            for j in range(count - 1):   # honest members are never flagged
                assert nodes[i].flags.count(nodes[j].peer_id) == 0
        assert {(run, epoch) for run, _, epoch in asked} == {("run", 1)}


@pytest.mark.parametrize("count", [3, 4])
async def test_without_evidence_the_share_cap_holds_an_inflated_weight_to_half(
        count, monkeypatch, autojump_clock):
    with_evidence(monkeypatch, lambda peer: None)   # this node tracks no progress
    async with open_memory_nodes(count) as nodes:
        await connect_all(nodes)
        attacker = 0   # a full member: its own part is share-capped by itself too
        group = make_group(nodes)
        weights = [INFLATED] + [100.0 * i for i in range(1, count)]
        xs, _ = attack_inputs(count, weights, attacker)
        results = await run_all(nodes, group, xs, weights, EXACT)
        others = sum(weights[1:])
        counted = [others] + weights[1:]    # exactly half of every chunk's total
        truth = weighted_mean(xs, counted, range(count))
        for result in results.values():
            assert result.completed
            assert max_error(result.tensors, truth) < 1e-6
            assert {c.weight for p in result.parts for c in p.contributions} == {2 * others}
        same_everywhere(results)
        # With half the weight, the flipped mean cancels the honest one: the
        # share cap bounds the weight, not what the values do with it.
        assert max(float(t.abs().max()) for t in results[1].tensors) < 1e-4
        for node in nodes:
            assert node.allreduce.statistics()["weights_capped"] == 0
            assert node.allreduce.statistics()["weights_share_capped"] == 1
            assert node.flags.count(nodes[attacker].peer_id) == 0   # no evidence, no flag


async def test_honest_rounds_with_evidence_are_unchanged_and_identical(monkeypatch,
                                                                       autojump_clock):
    samples = {}
    asked = with_evidence(monkeypatch, samples.get)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        weights = [100.0, 300.0, 250.0, 120.0]
        # one report lags (the last batch of 20 samples is not in it yet): within the slack
        samples.update({n.peer_id: int(w) for n, w in zip(nodes, weights, strict=True)})
        samples[nodes[3].peer_id] = 100
        xs = inputs(4)
        results = await run_all(nodes, make_group(nodes), xs, weights, EXACT)
        truth = weighted_mean(xs, weights, range(4))
        for result in results.values():
            assert result.completed and result.contributors() == {0, 1, 2, 3}
            assert max_error(result.tensors, truth) < 1e-6
        same_everywhere(results)
        for node in nodes:
            stats = node.allreduce.statistics()
            assert stats["weights_capped"] == 0 and stats["weights_share_capped"] == 0
            assert node.flags.flagged() == {}
        assert len(asked) == 4 * 3   # every reducer asked about each of its 3 senders


async def test_a_node_without_progress_evidence_has_only_the_share_cap(
        monkeypatch, autojump_clock):
    # progress holds no evidence (it tracks no such run): weight_evidence says None
    monkeypatch.setattr(ProgressService, "weight_evidence", lambda self, *args: None)
    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        weights = [1.0, 1.0, 1000.0]
        xs = inputs(3)
        results = await run_all(nodes, make_group(nodes), xs, weights, EXACT)
        truth = weighted_mean(xs, [1.0, 1.0, 2.0], range(3))
        for result in results.values():
            assert max_error(result.tensors, truth) < 1e-6
        same_everywhere(results)


async def test_the_share_cap_can_be_turned_off(monkeypatch, autojump_clock):
    with_evidence(monkeypatch, lambda peer: None)
    config = dataclasses.replace(EXACT, max_weight_share=1.0)
    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        weights = [1.0, 1.0, 1000.0]
        xs = inputs(3)
        results = await run_all(nodes, make_group(nodes), xs, weights, config)
        for result in results.values():
            assert max_error(result.tensors, weighted_mean(xs, weights, range(3))) < 1e-6


async def test_senders_introduce_themselves_to_every_reducer_before_streaming(autojump_clock):
    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        introduced = []
        for node in nodes:

            async def introduce(peer, run_id, me=node.peer_id):
                introduced.append((me, peer, run_id))

            node.allreduce._introduce = introduce
        group = make_group(nodes, clients={2})   # 2 reduces nothing: nobody dials it
        results = await run_all(nodes, group, inputs(3), [1.0, 1.0, 1.0], EXACT)
        assert all(r.completed for r in results.values())
        ids = [n.peer_id for n in nodes]
        assert sorted(introduced, key=repr) == sorted(
            [(ids[a], ids[b], "run") for a in range(3) for b in (0, 1) if a != b], key=repr)


async def test_a_fast_sender_is_held_back_without_being_excluded(monkeypatch, autojump_clock):
    """A reducer reads at most max_chunks_ahead chunks past the slowest sender;
    the sender held back waits on credit and is not timed out for it."""
    held = []
    add_chunk = PartReducer.add_chunk

    def counting_add_chunk(self, sender, *args, **kwargs):
        add_chunk(self, sender, *args, **kwargs)
        held.append(sum(1 for chunks in self.held if sender in chunks))

    monkeypatch.setattr(PartReducer, "add_chunk", counting_add_chunk)
    config = dataclasses.replace(EXACT, max_chunks_ahead=1, sender_timeout=2.0,
                                 reducer_timeout=4.0)
    node_config = dataclasses.replace(NodeConfig(), allreduce=config)
    async with open_memory_nodes(3, node_config) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, fractions=(1.0, 0.0, 0.0))   # 0 reduces everything
        xs = inputs(3)

        async def slow_send(stream, session, r, sent, pending):
            # one chunk every 1.5 s: never silent for sender_timeout, but far
            # behind sender 1, which is held at one chunk ahead for many seconds
            for chunk in session.layout.chunks[r]:
                await stream.send_tensor_chunk(
                    chunk.header(), chunk.codec.encode(session.flat[chunk.start:chunk.end]))
                await trio.sleep(1.5)

        nodes[2].allreduce._send_values = slow_send
        start = trio.current_time()
        results = await run_all(nodes, group, xs, [1.0, 1.0, 1.0], config)
        assert trio.current_time() - start > 5 * config.sender_timeout
        for result in results.values():
            assert result.completed and result.excluded == ()
            assert max_error(result.tensors, weighted_mean(xs, [1, 1, 1], range(3))) < 1e-6
        chunks = len(Layout.for_tensors([x.numel() for x in xs[0]], (1.0, 0.0, 0.0),
                                        config.codecs, config.chunk_values).chunks[0])
        assert chunks >= 6 and len(held) == 2 * chunks
        assert max(held) == 1   # sender 1 sent everything at once; one chunk was held


def test_the_median_cap_holds_every_weight_to_a_multiple_of_the_typical_one():
    from p2pdl.averaging import cap_to_median

    assert cap_to_median([100.0, 200.0, 300.0, INFLATED], 2.0) == [100.0, 200.0, 300.0, 400.0]
    assert cap_to_median([3.0, 10.0], 2.0) == [3.0, 6.0]            # two: the smaller rules
    assert cap_to_median([0.0, 5.0, 7.0], 1.0) == [0.0, 5.0, 5.0]   # 1: equal weights
    assert cap_to_median([INFLATED], 2.0) == [INFLATED]             # alone: nothing to compare
    assert cap_to_median([1.0, INFLATED], None) == [1.0, INFLATED]
    # two inflaters of five are still a minority: the median is an honest weight
    assert cap_to_median([10.0, 10.0, 10.0, INFLATED, INFLATED], 2.0) == [10.0] * 3 + [20.0] * 2
    with pytest.raises(Exception, match="max_weight_ratio"):
        AllReduceConfig(aggregator=MEAN, max_weight_ratio=0.5)


@pytest.mark.parametrize("rule", ["median", "centered_clip"])
async def test_under_a_robust_rule_a_claim_without_evidence_buys_at_most_the_median(
        rule, monkeypatch, autojump_clock):
    """The inflater claims 2**31 samples with no evidence anywhere: under a
    robust rule it counts for the median weight (200 of 700: the honest 300
    counts as the median too), not the half the share cap alone would leave
    it."""
    from p2pdl.averaging import Aggregator

    with_evidence(monkeypatch, lambda peer: None)
    config = dataclasses.replace(EXACT, aggregator=Aggregator(rule, tau=1e3))
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        weights = [INFLATED, 100.0, 200.0, 300.0]
        xs, _ = attack_inputs(4, weights, 0)
        results = await run_all(nodes, make_group(nodes), xs, weights, config)
        for result in results.values():
            assert result.completed
            assert {c.weight for p in result.parts for c in p.contributions} == {700.0}
        same_everywhere(results)
        for node in nodes:
            stats = node.allreduce.statistics()
            assert stats["weights_ratio_capped"] == 2 and stats["weights_share_capped"] == 0
