"""Claims bounded by evidence, on in-memory nodes in virtual time: the epoch by
quorum, role caps, membership, credentials, and the samples a peer's reports
support."""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
from libp2p.peer.id import ID

from p2pdl import NodeConfig
from p2pdl.errors import LocalProtocolError, P2PDLError
from p2pdl.progress import PROGRESS_PROTOCOL, SNAPSHOT_PREFIX, ProgressConfig, sign_report
from p2pdl.progress._messages import Push
from p2pdl.service import Refusal, Role
from p2pdl.testing import MemoryNetwork, open_memory_swarm, wait_for_dht, wait_until

pytestmark = pytest.mark.timeout(90)

RUN = "evidence-run"


class FakeMembers:
    """A run's membership as a certificate run would answer it, without the crypto:
    a credential is ``b"cert:<role>:"`` followed by the peer id's bytes.  The gate
    admits every request: what reaches the progress service is the question here."""

    def __init__(self, role: Role | None = Role.TRAINER) -> None:
        self.role = role
        self.known: dict[ID, Role] = {}
        self.learnt: list[ID] = []
        self.own: ID | None = None

    def bind(self, own: ID) -> None:
        """The node's own id, once the node is up (None role: not a member)."""
        self.own = own
        if self.role is not None:
            self.known[own] = self.role

    @staticmethod
    def credential_for(peer: ID, role: Role) -> bytes:
        return b"cert:" + role.value.encode() + b":" + peer.to_bytes()

    def admit(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None:
        return None

    def is_member(self, peer: ID, run_id: str) -> bool:
        return run_id == RUN and peer in self.known

    def role_of(self, peer: ID, run_id: str) -> Role | None:
        return self.known.get(peer) if run_id == RUN else None

    def credential(self, run_id: str) -> bytes | None:
        if run_id != RUN or self.role is None or self.own is None:
            return None
        return self.credential_for(self.own, self.role)

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool:
        for role in Role:
            if credential == self.credential_for(peer, role) and run_id == RUN:
                self.known[peer] = role
                self.learnt.append(peer)
                return True
        return False


@asynccontextmanager
async def gated_nodes(roles: list[Role | None], config: NodeConfig | None = None):
    """One in-memory node per role, each with its own FakeMembers (None: a non-member),
    which knows every member of the swarm unless a test says otherwise."""
    config = config or NodeConfig()
    async with open_memory_swarm(MemoryNetwork(latency=0.005)) as swarm:
        nodes, gates = [], []
        for role in roles:
            own = NodeConfig.build(config, initial_peers=[nodes[0].addrs[0]]) if nodes \
                else config
            gate = FakeMembers(role)
            node = await swarm.add(own, admission=gate)
            gate.bind(node.peer_id)
            nodes.append(node)
            gates.append(gate)
        for gate in gates:
            for node, role in zip(nodes, roles, strict=True):
                if role is not None:
                    gate.known[node.peer_id] = role
        await wait_for_dht(nodes)
        yield nodes, gates


def open_members(count: int) -> list[Role | None]:
    return [Role.TRAINER] * count


async def test_an_epoch_liar_among_three_honest_peers_moves_nobody_and_is_flagged(
        autojump_clock):
    async with gated_nodes(open_members(4)) as (nodes, _), AsyncExitStack() as stack:
        trackers = [await stack.enter_async_context(n.progress.track(RUN, 1000))
                    for n in nodes]
        honest, liar = trackers[:3], trackers[3]
        for tracker in honest:
            tracker.update_epoch(2)
        liar.update_epoch(10**6)
        await wait_until(lambda: all(t.global_progress().num_peers == 4 for t in trackers), 10)
        liar_id = nodes[3].peer_id
        for node, tracker in zip(nodes[:3], honest, strict=True):
            progress = tracker.global_progress()
            assert progress.epoch == 2 and progress.quorum_epoch == 2
            assert progress.ahead == {liar_id.to_bytes()} and not progress.ready_to_step
            await wait_until(lambda n=node: n.flags.count(liar_id, "epoch_ahead") == 1, 5)
            assert tracker.statistics()["flagged_epoch_ahead"] == 1
        # The honest peers step as they would without it: one steps first, the
        # others become ready; the liar is flagged once more at the new epoch.
        honest[0].update_epoch(3)
        await wait_until(lambda: all(t.ready_to_step and t.global_progress().epoch == 3
                                     for t in honest[1:]), 5)
        for tracker in honest[1:]:
            tracker.update_epoch(3)
        await wait_until(lambda: all(n.flags.count(liar_id, "epoch_ahead") == 2
                                     for n in nodes[:3]), 5)
        await trio.sleep(1.0)
        assert all(n.flags.count(liar_id, "epoch_ahead") == 2 for n in nodes[:3])
        assert all(t.global_progress().epoch == 3 and not t.ready_to_step for t in honest)
        # The liar itself keeps its epoch (a peer never goes back by the view).
        assert liar.global_progress().epoch == 10**6


async def test_a_joiner_at_epoch_zero_follows_a_lone_veteran(autojump_clock):
    async with gated_nodes(open_members(2)) as (nodes, _):
        async with nodes[0].progress.track(RUN, 1000) as veteran:
            veteran.update_epoch(40)
            async with nodes[1].progress.track(RUN, 1000) as joiner:
                await wait_until(lambda: joiner.global_progress().epoch == 40, 10)
                assert joiner.ready_to_step and joiner.local_epoch == 0
                assert nodes[1].flags.count(nodes[0].peer_id) == 0
                # The veteran keeps its epoch and does not count the joiner's samples.
                joiner.report(500, samples_per_second=0.0)
                await wait_until(lambda: veteran.global_progress().num_peers == 2, 10)
                await trio.sleep(1.0)
                assert veteran.global_progress().epoch == 40
                assert veteran.global_progress().samples_accumulated == 0


async def test_role_caps_drop_flag_and_count(autojump_clock):
    config = dataclasses.replace(NodeConfig(), progress=ProgressConfig(
        max_trainer_samples_per_second=100.0, burst_seconds=1.0))
    roles = [Role.TRAINER, Role.TRAINER, Role.AUXILIARY, Role.MONITOR]
    async with gated_nodes(roles, config) as (nodes, gates):
        victim, liar, aux, monitor = nodes
        async with victim.progress.track(RUN, 1000) as tracker:
            now = victim.dht.now()
            liar_key = liar.host.libp2p.get_private_key()
            aux_key = aux.host.libp2p.get_private_key()
            monitor_key = monitor.host.libp2p.get_private_key()
            reports = (
                sign_report(liar_key, liar.peer_id, RUN, 0, 10, 5000.0, now, False),  # rate
                sign_report(aux_key, aux.peer_id, RUN, 0, 40, 10.0, now, False),      # as trainer
                sign_report(monitor_key, monitor.peer_id, RUN, 0, 30, 1.0, now, False),
            )
            await liar.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, reports[:1]))
            await aux.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, reports[1:2]))
            await monitor.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, reports[2:]))
            stats = tracker.statistics()
            assert stats["dropped_impossible"] == 2 and stats["ignored_monitor"] == 1
            assert victim.flags.count(liar.peer_id, "impossible_rate") == 1
            assert victim.flags.count(aux.peer_id, "role_mismatch") == 1
            assert victim.flags.count(monitor.peer_id) == 0
            progress = tracker.global_progress()
            assert progress.samples_accumulated == 0 and progress.num_peers == 1
            # The monitor is no voice in the view but gets the gossip.
            assert monitor.peer_id.to_bytes() in tracker.members()
            # A plausible report of the liar is taken; then a count that grew
            # faster than the cap allows is not.
            good = sign_report(liar_key, liar.peer_id, RUN, 0, 50, 10.0, now + 0.1, False)
            await liar.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, (good,)))
            assert tracker.global_progress().samples_accumulated == 50
            await trio.sleep(1.0)
            jump = sign_report(liar_key, liar.peer_id, RUN, 0, 50 + 500, 10.0,
                               victim.dht.now(), False)
            await liar.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, (jump,)))
            assert victim.flags.count(liar.peer_id, "impossible_samples") == 1
            assert tracker.global_progress().samples_accumulated == 50
            assert victim.progress.reported_samples(RUN, liar.peer_id, 0) == 50


async def test_reports_of_non_members_are_not_counted_and_credentials_are_learnt(
        autojump_clock):
    # The victim knows only itself; the pusher is a member nobody was told of.
    async with gated_nodes([Role.TRAINER, Role.TRAINER, None]) as (nodes, gates):
        victim, member, outsider = nodes
        del gates[0].known[member.peer_id]
        async with victim.progress.track(RUN, 1000) as tracker:
            now = victim.dht.now()
            okey = outsider.host.libp2p.get_private_key()
            mkey = member.host.libp2p.get_private_key()
            bare = sign_report(okey, outsider.peer_id, RUN, 0, 70, 1.0, now, False)
            forged_credential = sign_report(
                okey, outsider.peer_id, RUN, 0, 70, 1.0, now, False,
                credential=FakeMembers.credential_for(member.peer_id, Role.TRAINER))
            # Forwarded by the outsider: a member's report without its credential...
            relayed = sign_report(mkey, member.peer_id, RUN, 0, 20, 1.0, now, False)
            await outsider.call(victim.peer_id, PROGRESS_PROTOCOL,
                                Push(RUN, (bare, forged_credential, relayed)))
            stats = tracker.statistics()
            assert stats["dropped_not_member"] == 3 and stats["reports_accepted"] == 0
            assert tracker.global_progress().samples_accumulated == 0
            assert victim.progress.reported_samples(RUN, outsider.peer_id, 0) == 0
            # ... and with it: the membership is learnt, the report counts.
            with_credential = sign_report(
                mkey, member.peer_id, RUN, 0, 20, 1.0, now + 0.1, False,
                credential=FakeMembers.credential_for(member.peer_id, Role.TRAINER))
            await outsider.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, (with_credential,)))
            assert gates[0].learnt == [member.peer_id]
            assert tracker.statistics()["credentials_learnt"] == 1
            assert tracker.global_progress().samples_accumulated == 20


async def test_members_learn_each_other_from_credentials_on_reports_and_snapshots(
        autojump_clock):
    async with gated_nodes(open_members(3)) as (nodes, gates):
        for gate, node in zip(gates, nodes, strict=True):   # each knows only itself
            gate.known = {node.peer_id: Role.TRAINER}
        async with AsyncExitStack() as stack:
            early = [await stack.enter_async_context(n.progress.track(RUN, 1000))
                     for n in nodes[:2]]
            early[0].report(100, samples_per_second=0.0)
            early[1].report(200, samples_per_second=0.0)
            await wait_until(lambda: all(t.global_progress().samples_accumulated == 300
                                         for t in early), 10)
            # Each stored its snapshot entry with its credential on its report.
            await wait_until(lambda: all(t.statistics()["snapshots_stored"] >= 1
                                         for t in early), 10)
            found = await nodes[2].dht.get(SNAPSHOT_PREFIX + RUN, latest=True)
            credentials = {entry.value.report.peer_id: entry.value.report.credential
                           for entry in found.value.values()}
            assert credentials == {n.peer_id.to_bytes():
                                   FakeMembers.credential_for(n.peer_id, Role.TRAINER)
                                   for n in nodes[:2]}
            late = await stack.enter_async_context(nodes[2].progress.track(RUN, 1000))
            await wait_until(lambda: late.global_progress().samples_accumulated == 300, 10)
            assert set(gates[2].learnt) == {nodes[0].peer_id, nodes[1].peer_id}
            await wait_until(lambda: all(t.global_progress().num_peers == 3 for t in early), 10)


async def test_an_oversized_credential_is_malformed_and_the_node_keeps_serving(autojump_clock):
    async with gated_nodes(open_members(3)) as (nodes, _):
        victim, honest, attacker = nodes
        async with victim.progress.track(RUN, 1000) as tracker, \
                honest.progress.track(RUN, 1000) as other:
            key = attacker.host.libp2p.get_private_key()
            big = sign_report(key, attacker.peer_id, RUN, 0, 1, 1.0, victim.dht.now(), False,
                              credential=b"x" * 2049)
            with pytest.raises(P2PDLError):
                await attacker.call(victim.peer_id, PROGRESS_PROTOCOL, Push(RUN, (big,)))
            other.report(33, samples_per_second=0.0)
            await wait_until(lambda: tracker.global_progress().samples_accumulated == 33, 10)


async def test_reported_samples_is_the_evidence_of_a_peers_signed_reports(autojump_clock):
    async with gated_nodes(open_members(2)) as (nodes, _):
        a, b = nodes
        assert b.progress.reported_samples(RUN, a.peer_id, 0) is None   # not tracked
        async with a.progress.track(RUN, 10**6) as ta, b.progress.track(RUN, 10**6) as tb:
            ta.report(300_000, samples_per_second=0.0)
            await wait_until(lambda: b.progress.reported_samples(RUN, a.peer_id, 0) == 300_000,
                             5)
            assert b.progress.reported_samples(RUN, a.peer_id, 1) == 0
            assert b.progress.reported_samples(RUN, b.peer_id, 0) == 0   # its own count
            ta.update_epoch(1)
            ta.report(50_000, samples_per_second=0.0)
            await wait_until(lambda: b.progress.reported_samples(RUN, a.peer_id, 1) == 50_000,
                             5)
            # The previous epoch is still judged (a round right after a step).
            assert b.progress.reported_samples(RUN, a.peer_id, 0) == 300_000
            tb.update_epoch(1)
            assert b.progress.reported_samples(RUN, a.peer_id, 0) == 300_000
            tb.update_epoch(3)
            assert b.progress.reported_samples(RUN, a.peer_id, 0) == 0    # forgotten


async def test_publish_now_pushes_a_fresh_report_whatever_the_policy_says(autojump_clock):
    async with gated_nodes(open_members(2)) as (nodes, _):
        a, b = nodes
        async with a.progress.track(RUN, 10**6) as ta, b.progress.track(RUN, 10**6) as tb:
            ta.report(1000, samples_per_second=0.0)
            await wait_until(lambda: tb.global_progress().samples_accumulated == 1000, 5)
            await trio.sleep(0.5)
            ta.report(1010, samples_per_second=0.0)   # within the drift tolerance: no news
            await trio.sleep(0.5)
            assert tb.global_progress().samples_accumulated == 1000
            published = ta.statistics()["reports_published"]
            ta.publish_now()
            await wait_until(lambda: b.progress.reported_samples(RUN, a.peer_id, 0) == 1010,
                             0.5)
            assert ta.statistics()["reports_published"] == published + 1
            ta.publish_now()   # nothing new, just published: not signed again
            assert ta.statistics()["reports_published"] == published + 1
        with pytest.raises(LocalProtocolError):
            ta.publish_now()
