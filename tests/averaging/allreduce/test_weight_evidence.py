"""The evidence of a weight travels with the claim: a sender attaches its own
signed progress report to its ``ar.begin``, and the reducer's progress service
takes it like a pushed report before it bounds the weight.

Real progress services on in-memory nodes in virtual time, with the gossip
silenced (no push, no snapshot): the only way a report reaches a reducer here
is the ``ar.begin`` it rides on.
"""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack

import msgpack
import pytest
import trio

from p2pdl.averaging import Aggregator, AllReduceConfig, CodecPolicy
from p2pdl.averaging.allreduce._messages import SENDER_MESSAGES, Begin
from p2pdl.errors import RemoteProtocolError
from p2pdl.progress import ProgressTracker, sign_report
from p2pdl.testing import open_memory_nodes
from p2pdl.wire import encode_message

from .test_service import connect_all, inputs, make_group, max_error, run_all, weighted_mean

#: These tests check the weighted mean (the default rule is CenteredClip).
MEAN = Aggregator()

pytestmark = pytest.mark.timeout(120)

EXACT = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"), chunk_values=1024,
                        averaging_timeout=60.0)
EPOCH = 1   # make_group's epoch, of run "run"


@pytest.fixture
def no_gossip(monkeypatch):
    """Trackers push nothing and read or store no snapshot."""

    async def no_push(self, peer, want_reply):
        return False

    async def no_snapshots(self):
        await trio.sleep_forever()

    monkeypatch.setattr(ProgressTracker, "_push", no_push)
    monkeypatch.setattr(ProgressTracker, "_snapshots", no_snapshots)


async def tracked(stack, nodes, samples):
    """Every node tracks "run" and has signed a report of ``samples[i]`` at EPOCH."""
    trackers = []
    for node, count in zip(nodes, samples, strict=True):
        tracker = await stack.enter_async_context(node.progress.track("run", 1000))
        tracker.report(count, EPOCH, samples_per_second=10.0)
        tracker.publish_now()
        trackers.append(tracker)
    return trackers


async def test_an_honest_report_on_the_begin_alone_backs_the_weight(no_gossip,
                                                                   autojump_clock):
    weights = [100, 200, 250]
    async with open_memory_nodes(3) as nodes, AsyncExitStack() as stack:
        await connect_all(nodes)
        trackers = await tracked(stack, nodes, weights)
        for node in nodes:
            own = node.progress.signed_report("run", EPOCH)
            assert own is not None and own.samples_accumulated == weights[nodes.index(node)]
            for other in nodes:
                if other is not node:   # nothing was gossiped
                    assert node.progress.reported_samples("run", other.peer_id, EPOCH) == 0
        xs = inputs(3)
        results = await run_all(nodes, make_group(nodes), xs, [float(w) for w in weights],
                                EXACT)
        truth = weighted_mean(xs, weights, range(3))
        for result in results.values():
            assert result.completed
            assert max_error(result.tensors, truth) < 1e-6
        for node, tracker in zip(nodes, trackers, strict=True):
            assert node.allreduce.statistics()["weights_capped"] == 0
            assert node.flags.flagged() == {}
            stats = tracker.statistics()
            assert stats["evidence_received"] == 2 and stats["evidence_refused"] == 0
            # Taken like a push: the evidence and the view hold the sender now.
            for other, count in zip(nodes, weights, strict=True):
                if other is not node:
                    assert node.progress.reported_samples("run", other.peer_id,
                                                          EPOCH) == count
            assert tracker.global_progress().num_peers == 3


def forged(node, other, kind):
    """A report the attacker ``node`` attaches: not one that backs its claim."""
    key = node.host.libp2p.get_private_key()
    now = node.dht.now()
    if kind == "forged":   # its own report with the count raised after signing
        report = node.progress.signed_report("run", EPOCH)
        return dataclasses.replace(report, samples_accumulated=10**6)
    if kind == "other_peer":   # a true report, of another member
        return other.progress.signed_report("run", EPOCH)
    if kind == "other_run":
        return sign_report(key, node.peer_id, "another-run", EPOCH, 900, 10.0, now, False)
    assert kind == "beyond_caps"   # signed, but far beyond a first report's cap
    return sign_report(key, node.peer_id, "run", EPOCH, 10**12, 10.0, now, False)


@pytest.mark.parametrize("kind", ["forged", "other_peer", "other_run", "beyond_caps"])
async def test_a_report_that_does_not_back_the_claim_is_refused_and_the_sender_capped(
        kind, no_gossip, autojump_clock):
    weights = [100, 200, 10**6]
    async with open_memory_nodes(3) as nodes, AsyncExitStack() as stack:
        await connect_all(nodes)
        attacker = 2
        trackers = await tracked(stack, nodes, [100, 200, 0])
        report = forged(nodes[attacker], nodes[0], kind)
        nodes[attacker].allreduce._own_report = lambda run_id, epoch: report
        group = make_group(nodes, clients={attacker})   # it reduces nothing
        xs = inputs(3)
        results = await run_all(nodes, group, xs, [float(w) for w in weights], EXACT)
        # No evidence of the attacker's samples: its weight counts for nothing.
        truth = weighted_mean(xs, [100, 200, 0], range(3))
        for result in results.values():
            assert result.completed
            assert max_error(result.tensors, truth) < 1e-6
        bad = nodes[attacker].peer_id
        for i in (0, 1):
            node, stats = nodes[i], trackers[i].statistics()
            assert node.allreduce.statistics()["weights_capped"] == 1
            assert node.flags.count(bad, "weight_beyond_evidence") == 1
            assert node.progress.reported_samples("run", bad, EPOCH) == 0
            assert stats["evidence_received"] == 2 and stats["evidence_refused"] == 1
            reason = {"forged": "dropped_bad_signature", "other_run": "dropped_wrong_run",
                      "beyond_caps": "dropped_impossible"}.get(kind)
            if reason is not None:
                assert stats[reason] == 1
            for j in (0, 1):   # the honest members are never flagged
                assert node.flags.count(nodes[j].peer_id) == 0
        if kind == "other_peer":   # member 1 did not learn member 0's report from it
            assert nodes[1].progress.reported_samples("run", nodes[0].peer_id, EPOCH) == 100
            assert trackers[1].statistics()["reports_accepted"] == 1   # 0's own, on its begin


async def test_a_begin_with_or_without_a_report_decodes(autojump_clock):
    async with open_memory_nodes(2) as nodes, AsyncExitStack() as stack:
        await tracked(stack, nodes[:1], [30])
        report = nodes[0].progress.signed_report("run", EPOCH)
        begin = Begin(b"g" * 32, 0, 1, b"l" * 32, 30.0, report=report)
        assert SENDER_MESSAGES.decode(encode_message(begin))[1] == begin
        # An older sender's begin has no report field: it decodes as None.
        tag, request_id, body = msgpack.unpackb(encode_message(begin), raw=False)
        del body["report"]
        old = msgpack.packb([tag, request_id, body], use_bin_type=True)
        assert SENDER_MESSAGES.decode(old)[1] == dataclasses.replace(begin, report=None)
        # A malformed report is a protocol error, as any malformed message.
        body["report"] = {"run_id": "run"}
        with pytest.raises(RemoteProtocolError):
            SENDER_MESSAGES.decode(msgpack.packb([tag, request_id, body], use_bin_type=True))
