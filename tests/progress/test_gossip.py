"""p2pdl.progress._gossip: one run's gossip on one node, sans-IO (no trio, times passed in)."""

from __future__ import annotations

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.progress import GlobalProgress, ProgressConfig, Verdict, sign_report
from p2pdl.progress._gossip import MAX_PUSH_BACKOFF, RunGossip
from p2pdl.progress._messages import DigestEntry
from p2pdl.service import FlagBook, OpenAdmission

RUN = "gossip-run"
NOW = 1_000_000.0


class Peer:
    def __init__(self, seed: int) -> None:
        self.key = create_new_key_pair(bytes([seed]) * 32)
        self.id = ID.from_pubkey(self.key.public_key)
        self.bytes = self.id.to_bytes()

    def report(self, epoch: int, samples: int, time: float = NOW, run: str = RUN):
        return sign_report(self.key.private_key, self.id, run, epoch, samples, 10.0, time, False)


ME, A, B = Peer(1), Peer(2), Peer(3)


def gossip(**config) -> tuple[RunGossip, FlagBook]:
    flags = FlagBook()
    return RunGossip(ME.bytes, RUN, 1000, ProgressConfig(**config), members=OpenAdmission(),
                     flags=flags, now=NOW), flags


def test_a_report_heard_from_a_third_peer_makes_a_member_to_introduce_oneself_to():
    g, _ = gossip()
    relayed = g.absorb(A.report(0, 10), B.bytes, NOW)
    assert relayed.verdict is Verdict.ACCEPTED and relayed.changed
    assert relayed.introduce == A.bytes and g.members() == [A.bytes]
    assert g.last_live == NOW   # not live: A's report came through B
    live = g.absorb(B.report(0, 5, NOW + 1), B.bytes, NOW + 1)
    assert live.verdict is Verdict.ACCEPTED and live.introduce is None
    assert g.last_live == NOW + 1
    # the same report again is stale; another run's and this peer's own are dropped
    assert g.absorb(B.report(0, 5, NOW + 1), B.bytes, NOW + 2).verdict is Verdict.STALE
    assert g.absorb(A.report(0, 20, NOW + 2, run="other"), A.bytes, NOW + 2).verdict is None
    assert g.absorb(ME.report(0, 1), A.bytes, NOW).verdict is Verdict.SELF
    stats = g.statistics()
    assert (stats.reports_accepted, stats.reports_stale, stats.dropped_wrong_run) == (2, 1, 1)
    assert stats.members == 2 and stats.peers == 2


def test_evidence_is_a_peers_own_report_and_is_kept_beside_the_local_epoch():
    g, _ = gossip()
    g.take_evidence(A.report(0, 40), B.bytes, NOW)   # B hands in A's report: refused
    assert g.reported_samples(A.bytes, 0) == 0
    assert g.counters["evidence_refused"] == 1
    g.take_evidence(A.report(0, 40), A.bytes, NOW)
    assert g.reported_samples(A.bytes, 0) == 40
    # A moved on to epoch 1 (a round with delayed updates): its epoch-0 report
    # arriving late is still evidence for epoch 0
    g.absorb(A.report(1, 3, NOW + 2), A.bytes, NOW + 2)
    g.take_evidence(A.report(0, 60, NOW + 1), A.bytes, NOW + 2)
    assert g.reported_samples(A.bytes, 0) == 60 and g.reported_samples(A.bytes, 1) == 3
    assert g.counters["evidence_refused"] == 1
    g.set_epoch(5)   # evidence of epochs far from the local one is dropped
    assert g.reported_samples(A.bytes, 0) == 0


def test_a_reader_that_asked_gets_every_accepted_report_bounded():
    g, _ = gossip()
    g.absorb(A.report(0, 5), A.bytes, NOW)
    assert g.take_accepted() == []                       # nobody asked: nothing kept
    g.keep_accepted(2)
    for t, samples in enumerate((10, 20, 30), start=1):   # each replaces the last in the view
        g.absorb(A.report(0, samples, NOW + t), A.bytes, NOW + t)
    g.absorb(A.report(0, 30, NOW + 3), A.bytes, NOW + 4)  # stale: not accepted
    assert [r.samples_accumulated for r in g.take_accepted()] == [20, 30]   # oldest dropped
    assert g.take_accepted() == []
    with pytest.raises(ValueError):
        g.keep_accepted(0)


def test_a_failing_member_rests_doubling_and_a_disconnected_one_leaves_the_view():
    g, _ = gossip(max_push_failures=2, sync_interval=1.0)
    g.absorb(A.report(0, 10), A.bytes, NOW)
    assert g.push_targets(set(), clock=0.0) == [A.bytes] and g.wants_reply(A.bytes)
    g.push_failed(A.bytes, connected=True, clock=0.0)
    assert g.push_targets(set(), clock=0.0) == [A.bytes]   # one failure: no rest yet
    g.push_failed(A.bytes, connected=True, clock=0.0)      # the second: rests 1 s
    assert g.push_targets(set(), clock=0.5) == [] and g.push_targets(set(), 1.0) == [A.bytes]
    g.push_failed(A.bytes, connected=True, clock=10.0)     # the third: rests 2 s
    assert g.push_targets(set(), clock=11.9) == [] and g.push_targets(set(), 12.0) == [A.bytes]
    for _ in range(20):
        g.push_failed(A.bytes, connected=True, clock=100.0)
    assert g.push_targets(set(), 100.0 + MAX_PUSH_BACKOFF - 0.1) == []
    assert len(g.view) == 1
    g.push_failed(A.bytes, connected=False, clock=200.0)
    assert len(g.view) == 0   # gone: out of the view at once, still a member
    g.push_succeeded(A.bytes)
    assert g.push_targets(set(), 200.0) == [A.bytes] and not g.wants_reply(A.bytes)
    assert (g.counters["pushes_failed"], g.counters["pushes_sent"]) == (24, 1)


def test_a_push_is_answered_with_what_its_digest_lacks_own_report_first():
    g, _ = gossip()
    g.absorb(A.report(0, 10), A.bytes, NOW)
    g.absorb(B.report(0, 20), B.bytes, NOW)
    own = ME.report(0, 7)
    digest = (DigestEntry(A.bytes, NOW),)   # the asker holds A's report already
    missing = g.missing_at(digest, exclude=b"", own=own, now=NOW)
    assert [r.peer_id for r in missing] == [ME.bytes, B.bytes]
    # its own report is not sent back to the asker
    assert [r.peer_id for r in g.missing_at((), B.bytes, None, NOW)] == [A.bytes]
    assert {e.peer_id for e in g.digest()} == {A.bytes, B.bytes}
    push = g.push(own, want_reply=True)
    assert push.reports == (own,) and push.want_reply and len(push.digest) == 2


def test_a_new_member_whose_push_asked_for_a_reply_is_in_sync():
    g, _ = gossip()
    assert not g.pushed_by(A.bytes, was_member=False, want_reply=True)   # not a member
    g.absorb(A.report(0, 10), A.bytes, NOW)
    assert g.pushed_by(A.bytes, was_member=False, want_reply=True)
    assert g.synced() == [A.bytes]
    assert not g.pushed_by(A.bytes, was_member=True, want_reply=True)


def test_a_peer_ahead_of_the_quorum_is_flagged_once_per_quorum_epoch():
    g, flags = gossip()
    g.absorb(A.report(9, 10), A.bytes, NOW)

    def progress(quorum: int) -> GlobalProgress:
        return GlobalProgress(epoch=quorum, samples_accumulated=0, estimated_samples=0.0,
                              target_batch_size=1000, num_peers=2, num_clients=0,
                              num_auxiliary=0, samples_per_second=0.0, eta_next_epoch=NOW,
                              ready_to_step=False, time=NOW, quorum_epoch=quorum,
                              ahead=frozenset({A.bytes}))

    g.judge(progress(2), NOW)
    g.judge(progress(2), NOW + 1)
    assert g.counters["flagged_epoch_ahead"] == 1
    g.judge(progress(3), NOW + 2)
    assert g.counters["flagged_epoch_ahead"] == 2
    assert flags.count(A.id, "epoch_ahead") == 2
