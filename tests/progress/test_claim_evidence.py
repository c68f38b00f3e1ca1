"""A report handed in as the evidence of a claim (``ProgressService.weight_evidence``,
what a reducer does with the report on an ``ar.begin``) goes through the checks
of a pushed report; ``signed_report`` is the node's own for an epoch.  In-memory
nodes, virtual time."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from p2pdl.progress import sign_report
from p2pdl.service import Role

from .test_evidence import RUN, gated_nodes

pytestmark = pytest.mark.timeout(90)


async def test_evidence_handed_in_is_checked_like_a_push_and_enters_the_view(autojump_clock):
    roles = [Role.TRAINER, Role.TRAINER, Role.AUXILIARY, Role.MONITOR, None]
    async with gated_nodes(roles) as (nodes, _):
        victim, trainer, aux, monitor, outsider = nodes
        assert victim.progress.weight_evidence(RUN, trainer.peer_id, 0) is None   # untracked
        async with victim.progress.track(RUN, 1000) as tracker:
            now = victim.dht.now()

            def signed(node, samples, epoch=0, time=now):
                return sign_report(node.host.libp2p.get_private_key(), node.peer_id, RUN,
                                   epoch, samples, 10.0, time, False)

            def hand_in(node, report):
                return victim.progress.weight_evidence(RUN, node.peer_id, 0, report)

            good = signed(trainer, 400)
            assert hand_in(trainer, good) == 400
            assert tracker.global_progress().samples_accumulated == 400   # in the view
            assert tracker.global_progress().num_peers == 2
            assert hand_in(trainer, good) == 400    # the same again: stale, not refused
            assert hand_in(trainer, None) == 400    # no report: what the node holds
            # Refused, counted, nothing changes:
            assert hand_in(aux, signed(aux, 40)) == 0                    # role caps
            assert victim.flags.count(aux.peer_id, "role_mismatch") == 1
            assert hand_in(monitor, signed(monitor, 30)) == 0            # a monitor's
            assert hand_in(outsider, signed(outsider, 70)) == 0          # not a member
            assert hand_in(monitor, good) == 0                           # another peer's
            forged = dataclasses.replace(signed(trainer, 500, time=now + 0.1),
                                         samples_accumulated=900)
            assert hand_in(trainer, forged) == 400                       # bad signature
            assert hand_in(trainer, signed(trainer, 10**9, time=now + 0.2)) == 400  # caps
            assert victim.flags.count(trainer.peer_id, "impossible_samples") == 1
            stats = tracker.statistics()
            assert stats["evidence_received"] == 8 and stats["evidence_refused"] == 6
            assert stats["dropped_impossible"] == 2 and stats["ignored_monitor"] == 1
            assert stats["dropped_not_member"] == 1 and stats["dropped_bad_signature"] == 1
            assert tracker.global_progress().samples_accumulated == 400


async def test_a_report_overtaken_by_a_later_epoch_is_still_evidence(autojump_clock):
    """With delayed updates a peer announces epoch e + 1 before its round of e:
    the report of e it attaches is older than the one the reducer holds."""
    async with gated_nodes([Role.TRAINER, Role.TRAINER]) as (nodes, _):
        victim, peer = nodes
        key = peer.host.libp2p.get_private_key()
        async with victim.progress.track(RUN, 1000) as tracker:
            now = victim.dht.now()
            at_0 = sign_report(key, peer.peer_id, RUN, 0, 600, 10.0, now, False)
            beyond = sign_report(key, peer.peer_id, RUN, 0, 10**9, 10.0, now + 0.05, False)
            at_1 = sign_report(key, peer.peer_id, RUN, 1, 0, 10.0, now + 0.1, False)
            assert victim.progress.weight_evidence(RUN, peer.peer_id, 1, at_1) == 0
            assert victim.progress.weight_evidence(RUN, peer.peer_id, 0, at_0) == 600
            assert tracker.global_progress().samples_accumulated == 0   # the view keeps e + 1
            # The late path keeps the caps of a first report at its epoch.
            assert victim.progress.weight_evidence(RUN, peer.peer_id, 0, beyond) == 600
            assert victim.flags.count(peer.peer_id, "impossible_samples") == 1
            forged = dataclasses.replace(at_0, samples_accumulated=700)
            assert victim.progress.weight_evidence(RUN, peer.peer_id, 0, forged) == 600
            stats = tracker.statistics()
            assert stats["evidence_received"] == 4 and stats["evidence_refused"] == 2


async def test_signed_report_is_the_nodes_own_for_its_two_latest_epochs(autojump_clock):
    async with gated_nodes([Role.TRAINER, Role.TRAINER]) as ((node, _other), _):
        assert node.progress.signed_report(RUN, 0) is None   # untracked
        async with node.progress.track(RUN, 1000) as tracker:
            tracker.report(120, samples_per_second=1.0)
            tracker.publish_now()
            own = node.progress.signed_report(RUN, 0)
            assert own is not None and own.samples_accumulated == 120
            assert own.peer_id == node.peer_id.to_bytes()
            await trio.sleep(0.1)
            tracker.report(150, samples_per_second=1.0)
            tracker.publish_now()
            assert node.progress.signed_report(RUN, 0).samples_accumulated == 150
            tracker.update_epoch(1)
            tracker.publish_now()
            assert node.progress.signed_report(RUN, 1).samples_accumulated == 0
            assert node.progress.signed_report(RUN, 0).samples_accumulated == 150
            tracker.update_epoch(2)
            tracker.publish_now()
            assert node.progress.signed_report(RUN, 2) is not None
            assert node.progress.signed_report(RUN, 1) is not None
            assert node.progress.signed_report(RUN, 0) is None   # only the two latest
