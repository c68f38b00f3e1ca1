"""Signed results: a reducer that equivocates is proven so by its own
signatures, and the proof travels to the run's other members."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl import Authority, CertificateRun, Role
from p2pdl.averaging import AllReduceConfig, CodecPolicy, Group, GroupMemberInfo
from p2pdl.averaging.allreduce._accusations import (
    ACCUSATIONS_PREFIX,
    MAX_ACCUSATIONS,
    AccusationBoard,
    Accusations,
    Equivocation,
    equivocation_problem,
    find_equivocations,
)
from p2pdl.averaging.allreduce._evidence import result_payload
from p2pdl.testing import open_memory_nodes, wait_for_dht

from .test_service import connect_all, inputs
from .test_verify import run_group

pytestmark = pytest.mark.timeout(120)

CONFIG = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024)
RUN = "closed"


def proof_of(keys, group_id=b"g" * 32, part=1, digests=(b"a" * 32, b"b" * 32)):
    peer = ID.from_pubkey(keys.public_key)
    return Equivocation(group_id, part, peer.to_bytes(), list(digests),
                        [keys.private_key.sign(result_payload(group_id, part, d))
                         for d in digests])


def test_two_signed_results_prove_an_equivocation_and_nothing_else_does():
    keys = create_new_key_pair()
    proof = proof_of(keys)
    assert equivocation_problem(proof) is None
    same = proof_of(keys, digests=(b"a" * 32, b"a" * 32))
    assert "same" in equivocation_problem(same)
    other = create_new_key_pair()
    framed = Equivocation(proof.group_id, proof.part, ID.from_pubkey(other.public_key).to_bytes(),
                          proof.digests, proof.signatures)
    assert "signature" in equivocation_problem(framed)
    moved = Equivocation(proof.group_id, 2, proof.reducer, proof.digests, proof.signatures)
    assert "signature" in equivocation_problem(moved)
    swapped = Equivocation(proof.group_id, 1, proof.reducer, proof.digests,
                           proof.signatures[::-1])
    assert equivocation_problem(swapped) is not None
    assert equivocation_problem(Equivocation(b"g", 1, b"junk", [b"a", b"b"], [b"", b""]))
    assert equivocation_problem(Equivocation(b"g", 1, proof.reducer, [b"a"], [b""]))


def test_a_member_finds_an_equivocation_in_what_the_others_say_they_hold():
    keys = create_new_key_pair()
    reducer = ID.from_pubkey(keys.public_key).to_bytes()
    group = b"g" * 32

    def signed(digest):
        return digest, keys.private_key.sign(result_payload(group, 1, digest))

    mine, theirs = signed(b"a" * 32), signed(b"b" * 32)
    reducers = [b"", reducer]
    found = find_equivocations(group, reducers, {1: mine[0]}, {1: mine[1]},
                               {2: {1: mine}, 3: {1: theirs}})
    assert list(found) == [1] and found[1][0] == 3
    assert equivocation_problem(found[1][1]) is None
    # the same result, a signature that is not the reducer's, a part not held
    assert find_equivocations(group, reducers, {1: mine[0]}, {1: mine[1]},
                              {2: {1: mine}, 3: {1: (b"b" * 32, mine[1])}}) == {}
    assert find_equivocations(group, reducers, {}, {}, {3: {1: theirs}}) == {}


def test_the_board_keeps_its_latest_proofs_and_checks_each_once():
    board = AccusationBoard()
    keys = create_new_key_pair()
    proofs = [proof_of(keys, part=i) for i in range(MAX_ACCUSATIONS + 2)]
    for proof in proofs:
        assert board.accuse("run", proof)
    assert not board.accuse("run", proofs[-1])
    assert board.record("run").equivocations == proofs[2:]
    assert board.pending() == ["run"] and board.watched() == ["run"]
    board.published("run")
    assert board.pending() == []
    assert board.unchecked(b"owner", proofs[:3]) == proofs[:3]
    assert board.unchecked(b"owner", proofs[:4]) == proofs[3:4]
    assert board.unchecked(b"other", proofs[:1]) == proofs[:1]
    assert board.first_proof(proofs[0]) and not board.first_proof(proofs[0])
    forged = Equivocation(proofs[0].group_id, 9, proofs[0].reducer, proofs[0].digests,
                          proofs[0].signatures)
    true, false = board.judge(b"third", Accusations([proofs[5], forged]))
    assert true == [proofs[5]] and [p for p, _ in false] == [forged]
    assert board.judge(b"third", Accusations([proofs[5], forged])) == ([], [])


def equivocate(node) -> None:
    """``node``'s reducer sends the lowest-indexed other member a result other
    than everyone else's (one value changed), under its own signature: the
    ``equivocate`` attack's reducer (p2pdl.training.ATTACKS)."""
    from p2pdl.training._attacks import _equivocating_reducer

    node.allreduce.part_reducer = _equivocating_reducer()


async def test_a_reducer_that_equivocates_is_banned_by_every_member_on_its_signatures():
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        equivocate(nodes[3])
        results, _ = await run_group(nodes, CONFIG, b"equivocate")
        flats = [torch.cat([t.flatten() for t in results[i].tensors]) for i in range(4)]
        for i in range(3):
            # the part dropped alike by every honest member; the others kept
            assert results[i].parts[3].check == "failed"
            assert [p.check for r, p in enumerate(results[i].parts) if r not in (i, 3)] \
                == ["ok"] * 2
            stats = nodes[i].allreduce.statistics()
            assert stats["equivocations"] == 1 and stats["disputes_opened"] == 0
            assert nodes[i].flags.count(nodes[3].peer_id, "equivocation") == 1
            assert nodes[i].flags.is_banned(nodes[3].peer_id, "run", time.time())
            for r in range(3):
                assert nodes[i].flags.count(nodes[r].peer_id) == 0
        lo, hi = results[0].parts[0].start, results[0].parts[2].end
        for i in (1, 2):   # the honest reducers' parts bit-identical
            assert torch.equal(flats[i][lo:hi], flats[0][lo:hi])
        # An open run: nothing published.
        assert all(n.allreduce.statistics()["accusations_published"] == 0 for n in nodes)


async def test_a_proof_travels_to_a_member_outside_the_group_and_a_forged_one_bans_its_signer(
        autojump_clock):
    authority = Authority.generate()
    config = AllReduceConfig(codecs=CONFIG.codecs, chunk_values=CONFIG.chunk_values)
    async with open_memory_nodes(6) as nodes:
        await wait_for_dht(nodes)
        for node in nodes[:5]:   # nodes[5]: a stranger's DHT node
            cert = authority.issue(RUN, node.peer_id, Role.TRAINER, now=node.dht.now())
            node.membership.add_run(CertificateRun(RUN, authority.id, cert))
        members = nodes[:4]   # nodes[4]: a member of the run, not of the group
        equivocate(members[3])
        for a in members:
            for b in members:
                if a is not b:
                    await a.membership.introduce(b.peer_id, RUN)
        group = Group(hashlib.sha256(b"travel").digest(), RUN, 1,
                      tuple(GroupMemberInfo(n.peer_id) for n in members))
        xs = inputs(4)
        results = {}

        async def one(i):
            results[i] = await members[i].allreduce.all_reduce(group, xs[i], config=config)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        assert all(results[i].parts[3].check == "failed" for i in range(3))
        await trio.sleep(1)   # the members publish their proofs at once
        assert all(members[i].allreduce.statistics()["accusations_published"] == 1
                   for i in range(3))
        outsider_store = nodes[5].dht.local_store.get(ACCUSATIONS_PREFIX + RUN,
                                                      nodes[5].dht.now())
        assert not outsider_store   # the run's record stays with its members
        reader = nodes[4]
        assert not reader.flags.is_banned(members[3].peer_id, RUN, time.time())
        assert await reader.allreduce.read_accusations(RUN) == 3
        assert reader.flags.count(members[3].peer_id, "equivocation") == 1   # one lie
        assert reader.flags.is_banned(members[3].peer_id, RUN, time.time())
        assert reader.allreduce.statistics()["accusations_upheld"] == 3
        assert await reader.allreduce.read_accusations(RUN) == 0   # each checked once

        # Member 1 publishes a forged proof against member 2 (signatures of its own).
        liar = members[1]
        keys = create_new_key_pair()
        forged = proof_of(keys, group_id=group.group_id, part=2)
        forged = Equivocation(forged.group_id, 2, members[2].peer_id.to_bytes(),
                              forged.digests, forged.signatures)
        assert await liar.dht.store(ACCUSATIONS_PREFIX + RUN, Accusations([forged]),
                                    liar.dht.now() + 7200, subkey=liar.dht.own_subkey())
        assert await reader.allreduce.read_accusations(RUN) == 1
        assert reader.flags.count(liar.peer_id, "false_accusation") == 1
        assert reader.flags.is_banned(liar.peer_id, RUN, time.time())
        assert reader.flags.count(members[2].peer_id) == 0
        # The members read each other's records on their own, within the interval.
        await trio.sleep(config.accusation_interval + 5)
        assert members[0].flags.count(liar.peer_id, "false_accusation") == 1
