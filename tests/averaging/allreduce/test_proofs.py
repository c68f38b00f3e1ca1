"""Disputes' proofs travel: a member that was not in the group is convinced of
a reducer's or a contributor's lie by the proof a verifier publishes, and a
false proof bans its publisher, never the accused."""

from __future__ import annotations

import dataclasses
import hashlib
import time

import pytest
import trio

from p2pdl import Authority, CertificateRun, Role
from p2pdl.averaging import AllReduceConfig, CodecPolicy, Group, GroupMemberInfo, Layout
from p2pdl.averaging.allreduce._accusations import (
    ACCUSATIONS_PREFIX,
    MAX_FETCH_TRIES,
    AccusationBoard,
    Accusations,
    DisputeClaim,
)
from p2pdl.averaging.allreduce._messages import Proof, Shown
from p2pdl.averaging.allreduce._proofs import (
    KeptProof,
    KeptProofs,
    check_header,
    judge,
)
from p2pdl.errors import RemoteProtocolError
from p2pdl.testing import open_memory_nodes, wait_for_dht

from .test_disputes import frame
from .test_service import inputs
from .test_verify import lying_reducer

pytestmark = pytest.mark.timeout(120)

CONFIG = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024)
RUN = "closed"


async def closed_round(nodes, tag: bytes, config: AllReduceConfig = CONFIG) -> dict:
    """nodes[:5] hold certificates of RUN; nodes[:4] average one round in a
    group (nodes[4]: a member of the run, not of the group; nodes[5], if
    any: a stranger)."""
    authority = Authority.generate()
    await wait_for_dht(nodes)
    for node in nodes[:5]:
        cert = authority.issue(RUN, node.peer_id, Role.TRAINER, now=node.dht.now())
        node.membership.add_run(CertificateRun(RUN, authority.id, cert))
    members = nodes[:4]
    for a in members:
        for b in members:
            if a is not b:
                await a.membership.introduce(b.peer_id, RUN)
    group = Group(hashlib.sha256(tag).digest(), RUN, 1,
                  tuple(GroupMemberInfo(n.peer_id) for n in members))
    xs = inputs(4)
    results = {}

    async def one(i):
        results[i] = await members[i].allreduce.all_reduce(group, xs[i], config=config)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(one, i)
    await trio.sleep(1)   # the members publish their claims at once
    return results


def kept(node) -> list[KeptProof]:
    return list(node.allreduce._proofs._kept.values())


def judged(proof: KeptProof):
    plan = check_header(proof.header, proof.run_id)
    return judge(proof.header, plan, proof.result, proof.own, proof.shown)


@pytest.mark.parametrize("codec", ["fp16", "uint8", "uint4"])
async def test_a_lying_reducers_proof_convinces_a_member_outside_the_group(
        monkeypatch, autojump_clock, codec):
    # (uint8 payloads do not come back byte for byte from their values: kept)
    lying_reducer(monkeypatch, 3, 10.0)
    config = dataclasses.replace(CONFIG, codecs=CodecPolicy(large=codec, threshold=1000))
    async with open_memory_nodes(6) as nodes:
        results = await closed_round(nodes, b"liar", config)
        liar, reader = nodes[3], nodes[4]
        for i in range(3):
            assert results[i].parts[3].check == "failed"
            stats = nodes[i].allreduce.statistics()
            assert stats["proofs_kept"] == 1 and stats["accusations_published"] == 0
            (proof,) = kept(nodes[i])
            finding = judged(proof)   # the publisher's proof proves what it found
            assert finding.reducer_lied and not finding.liars
        # the stranger's DHT node holds none of the run's records
        assert not nodes[5].dht.local_store.get(ACCUSATIONS_PREFIX + RUN, nodes[5].dht.now())
        assert not reader.flags.is_banned(liar.peer_id, RUN, time.time())
        assert await reader.allreduce.read_accusations(RUN) == 3
        stats = reader.allreduce.statistics()
        assert stats["proofs_fetched"] == 3 and stats["accusations_upheld"] == 3
        assert stats["lies_proven"] == 1 and stats["accusations_false"] == 0
        assert reader.flags.count(liar.peer_id, "reducer_lie") == 1   # one lie, one flag
        assert reader.flags.is_banned(liar.peer_id, RUN, time.time())
        for i in range(3):
            assert reader.flags.count(nodes[i].peer_id) == 0
            # (to the reader, and to the other two publishers, who read at once)
            assert nodes[i].allreduce.statistics()["proofs_served"] == 3
        assert await reader.allreduce.read_accusations(RUN) == 0   # each judged once
        # The members read each other's claims on their own: the lie they proved
        # themselves flags nothing more.
        await trio.sleep(CONFIG.accusation_interval + 5)
        for i in range(3):
            assert nodes[i].flags.count(liar.peer_id, "reducer_lie") == 1
            assert nodes[i].allreduce.statistics()["proofs_fetched"] == 2


async def test_a_framers_proof_bans_the_framer_and_never_the_honest_reducers(
        monkeypatch, autojump_clock):
    frame(monkeypatch, 2)
    async with open_memory_nodes(5) as nodes:
        results = await closed_round(nodes, b"frame")
        framer, reader = nodes[2], nodes[4]
        for i in (0, 1, 3):
            assert [p.check for r, p in enumerate(results[i].parts) if r != i] == ["ok"] * 3
            for proof in kept(nodes[i]):
                finding = judged(proof)
                assert not finding.reducer_lied and finding.liars == {2}
        assert await reader.allreduce.read_accusations(RUN) > 0
        assert reader.flags.count(framer.peer_id, "report_lie") == 1
        assert reader.flags.is_banned(framer.peer_id, RUN, time.time())
        for i in (0, 1, 3):
            assert reader.flags.count(nodes[i].peer_id) == 0


def tamper(proof: KeptProof, what: str) -> KeptProof:
    """``proof`` with one thing changed, as a publisher that lies would."""
    h = proof.header
    if what == "result":
        first = bytearray(proof.result[0])
        first[0] ^= 1
        return dataclasses.replace(proof, result=(bytes(first), *proof.result[1:]))
    if what == "own":
        first = bytearray(proof.own[0])
        first[0] ^= 1
        return dataclasses.replace(proof, own=(bytes(first), *proof.own[1:]))
    if what == "member":
        members = list(h.members)
        members[1], members[2] = members[2], members[1]
        return dataclasses.replace(proof, header=dataclasses.replace(h, members=members))
    if what == "layout":
        other = Layout.for_tensors([10, 20], [0.25] * 4, CodecPolicy(), 1024)
        return dataclasses.replace(proof, header=dataclasses.replace(h, layout=other.preimage))
    if what == "reports":   # a report the reducer was not shown left out
        dispute = dataclasses.replace(h.dispute, reports=h.dispute.reports[1:])
        return dataclasses.replace(proof, header=dataclasses.replace(h, dispute=dispute))
    if what == "shown":   # what the reducer showed left out
        answer = Proof([], h.answer.committed, h.answer.signature)
        return dataclasses.replace(proof, header=dataclasses.replace(h, answer=answer),
                                   shown=())
    if what == "nonce":
        dispute = dataclasses.replace(h.dispute, nonce=bytes(32))
        return dataclasses.replace(proof, header=dataclasses.replace(h, dispute=dispute))
    if what == "run":
        return dataclasses.replace(proof, header=dataclasses.replace(h, run_id="other"))
    if what == "own_commitment":
        own = h.own
        assert own is not None
        forged = Shown(own.contributor, own.delivered, own.chunks, bytes(64))
        return dataclasses.replace(proof, header=dataclasses.replace(h, own=forged))
    raise AssertionError(what)


TAMPERING = ["result", "own", "member", "layout", "reports", "shown", "nonce", "run",
             "own_commitment"]


async def test_a_false_proof_proves_nothing_and_bans_its_publisher(monkeypatch,
                                                                   autojump_clock):
    frame(monkeypatch, 2)   # proofs that show chunks (the framer's)
    async with open_memory_nodes(5) as nodes:
        await closed_round(nodes, b"forge")
        publisher, reader = nodes[1], nodes[4]
        proof = next(p for p in kept(nodes[0]) if p.shown)
        assert judged(proof).liars == {2}
        for what in TAMPERING:
            with pytest.raises(RemoteProtocolError):
                judged(tamper(proof, what))
        # Member 1 publishes, under its own subkey, a claim of a tampered proof
        # it serves; and a claim of one it does not serve.
        false = tamper(proof, "result")
        digest = publisher.allreduce._proofs.add(dataclasses.replace(false, run_id=RUN))
        header = proof.header
        claims = [DisputeClaim(header.dispute.group_id, header.part, digest),
                  DisputeClaim(header.dispute.group_id, header.part, b"\1" * 32)]
        assert await publisher.dht.store(ACCUSATIONS_PREFIX + RUN, Accusations([], claims),
                                         publisher.dht.now() + 7200,
                                         subkey=publisher.dht.own_subkey())
        await reader.allreduce.read_accusations(RUN)
        stats = reader.allreduce.statistics()
        assert reader.flags.count(publisher.peer_id, "false_accusation") == 1
        assert reader.flags.is_banned(publisher.peer_id, RUN, time.time())
        assert stats["accusations_false"] == 1 and stats["proofs_unfetched"] == 1
        for i in (0, 2, 3):
            assert reader.flags.count(nodes[i].peer_id, "false_accusation") == 0
            assert reader.flags.count(nodes[i].peer_id, "reducer_lie") == 0


def test_the_board_claims_each_proof_once_and_gives_up_fetching_after_its_tries():
    board = AccusationBoard()
    claim = DisputeClaim(b"g" * 32, 1, b"d" * 32)
    assert board.claim("run", claim) and not board.claim("run", claim)
    assert board.pending() == ["run"] and board.record("run").disputes == [claim]
    assert board.record("other").disputes is None
    record = Accusations([], [claim])
    for _ in range(MAX_FETCH_TRIES - 1):
        assert board.unfetched(b"owner", record) == [claim]
        board.fetched(b"owner", claim, judged=False)
    assert board.unfetched(b"owner", record) == [claim]
    board.fetched(b"owner", claim, judged=False)
    assert board.unfetched(b"owner", record) == []   # given up
    assert board.unfetched(b"another", record) == [claim]
    board.fetched(b"another", claim, judged=True)
    assert board.unfetched(b"another", record) == []
    assert board.first_lie("reducer_lie", b"g" * 32, 1, b"p")
    assert not board.first_lie("reducer_lie", b"g" * 32, 1, b"p")
    assert board.first_lie("report_lie", b"g" * 32, 1, b"p")


def test_kept_proofs_are_bounded_by_count_and_bytes(monkeypatch):
    from p2pdl.averaging.allreduce import _proofs

    digests = iter(range(100))
    monkeypatch.setattr(_proofs, "proof_digest", lambda header: bytes([next(digests)]) * 32)

    def proof(i: int, size: int) -> KeptProof:
        return KeptProof(f"r{i}", None, (bytes(size),), (), ())   # type: ignore[arg-type]

    kept_proofs = KeptProofs(max_proofs=3, max_bytes=1000)
    first = kept_proofs.add(proof(0, 10))
    for i in range(1, 4):
        kept_proofs.add(proof(i, 10))
    assert len(kept_proofs) == 3 and kept_proofs.get("r0", first) is None
    big = kept_proofs.add(proof(9, 2000))   # the newest stays, alone beyond the bytes
    assert len(kept_proofs) == 1 and kept_proofs.get("r9", big) is not None
    assert kept_proofs.get("r0", big) is None   # of another run


def test_a_receiver_keeps_only_the_payloads_its_codec_does_not_give_back():
    import torch

    from p2pdl.averaging import CODECS, PartReceiver

    for name, codec in CODECS.items():   # what ``reencodes`` says is true
        differs = 0
        for seed in range(20):
            x = torch.randn(5000, generator=torch.Generator().manual_seed(seed)) * (seed + 1)
            payload = bytes(codec.encode(x))
            back = torch.empty(5000)
            codec.decode(payload, 5000, out=back)
            differs += bytes(codec.encode(back)) != payload
        if codec.sparse:
            # re-encoding picks the same positions unless values tie (zeros kept
            # in a block with fewer than k nonzeros): never claimed
            assert not codec.reencodes, name
        else:
            assert (differs == 0) == codec.reencodes, name
    for large, kept in (("uint8", True), ("uint4", True), ("fp16", False)):
        layout = Layout.for_tensors([10, 3000], [0.5, 0.5],
                                    CodecPolicy(large=large, threshold=100), 1024)
        values = torch.randn(layout.numel)
        out = torch.empty(layout.part_numel(1))
        receiver = PartReceiver(layout, 1, out, 2, keep=True)
        payloads = []
        for chunk in layout.chunks[1]:
            payloads.append(bytes(chunk.codec.encode(values[chunk.start:chunk.end])))
            receiver.add_chunk(chunk.header(), payloads[-1])
        assert receiver.kept == ({k: p for k, p in enumerate(payloads)} if kept else {})
        assert PartReceiver(layout, 1, out, 2).kept is None
