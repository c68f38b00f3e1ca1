"""Disputes: commitments, signed reports, and who a failed check proves a liar."""

from __future__ import annotations

import time

import pytest
import torch
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.averaging import AllReduceConfig, CodecPolicy, Layout, PartReducer
from p2pdl.averaging.allreduce import ALLREDUCE_PROTOCOL_ID, _evidence, _service, _verify
from p2pdl.averaging.allreduce._evidence import (
    chunk_digest,
    commitment_payload,
    pack_sketch,
    report_payload,
    signed_by,
    unpack_report,
)
from p2pdl.averaging.allreduce._messages import REDUCER_MESSAGES, Begin, Reject
from p2pdl.averaging.allreduce._state import RejectError
from p2pdl.averaging.allreduce._verify import REPORT_TOLERANCE, SKETCH_BUCKETS, Report, deviates
from p2pdl.errors import RemoteProtocolError
from p2pdl.testing import open_memory_nodes

from .test_service import connect_all, make_group
from .test_verify import lying_reducer, run_group

pytestmark = pytest.mark.timeout(120)

CONFIG = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024)


def test_signatures_bind_the_signer_and_every_byte():
    keys = create_new_key_pair()
    peer = ID.from_pubkey(keys.public_key)
    other = ID.from_pubkey(create_new_key_pair().public_key)
    payload = commitment_payload(b"g" * 32, 1, 2, b"l" * 32, [b"\x01" * 32, b"\x02" * 32])
    signature = keys.private_key.sign(payload)
    assert signed_by(peer, payload, signature)
    assert not signed_by(other, payload, signature)
    assert not signed_by(peer, commitment_payload(b"g" * 32, 1, 3, b"l" * 32,
                                                 [b"\x01" * 32, b"\x02" * 32]),
                         signature)
    assert not signed_by(peer, payload, None) and not signed_by(peer, payload, b"\0" * 64)
    report = report_payload(b"g" * 32, 1, 2, b"n" * 32, b"d" * 32, b"s" * 1024, [0.5])
    assert report != report_payload(b"g" * 32, 1, 2, b"m" * 32, b"d" * 32, b"s" * 1024, [0.5])


def test_a_report_deviates_beyond_rounding_only():
    gen = torch.Generator().manual_seed(0)
    true = Report(tuple((torch.randn(SKETCH_BUCKETS, generator=gen, dtype=torch.float64) * 0.01
                         ).tolist()), (0.25, 1.5))
    sent = unpack_report(pack_sketch(true.sketch), true.distances)   # float32 on the wire
    assert sent is not None and not deviates(sent, true, 0.75)
    shifted = Report((sent.sketch[0] + 10 * REPORT_TOLERANCE * 0.75,) + sent.sketch[1:],
                     sent.distances)
    assert deviates(shifted, true, 0.75)
    assert deviates(Report(sent.sketch, (0.25, 1.6)), true, 0.75)
    assert deviates(Report(tuple(-v for v in sent.sketch), sent.distances), true, 0.75)
    assert deviates(Report(sent.sketch[:-1], sent.distances), true, 0.75)
    assert unpack_report(b"\0" * 12, ()) is None


def test_a_reducer_refuses_a_chunk_that_is_not_the_one_committed_and_keeps_the_others():
    layout = Layout.for_tensors([3000], [0.5, 0.5], CodecPolicy(large="fp16", threshold=100),
                                1024, _verify.Aggregator("centered_clip", tau="auto"))
    values = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    lo, hi = layout.part_bounds[0]
    reducer = PartReducer(layout, 0, [1], values[lo:hi].clone(), 1.0, 0, 0.0, 10.0)
    payloads = [bytes(c.codec.encode(values[c.start:c.end] + 1)) for c in layout.chunks[0]]
    digests = [chunk_digest(p) for p in payloads]
    reducer.begin(1, 1.0, True, 0.0, committed=digests, commitment=b"sig")
    first = layout.chunks[0][0]
    reducer.add_chunk(1, first.header(), payloads[0], 0.0)
    tampered = bytearray(payloads[1])
    tampered[0] ^= 1
    with pytest.raises(RemoteProtocolError, match="committed"):
        reducer.add_chunk(1, layout.chunks[0][1].header(), bytes(tampered), 0.0)
    reducer.fail(1, "broke its commitment")
    reducer.finalize()
    assert reducer.complete
    evidence = reducer.evidence(b"g" * 32)
    assert evidence.committed[1] == (tuple(digests), b"sig", (payloads[0],))
    assert evidence.nbytes == len(payloads[0])


def frame(monkeypatch, liar: int) -> None:
    """Member ``liar`` flips the sign of every sketch it reports on others' parts:
    within its bound, and enough to fail an honest reducer's check."""
    honest = _verify.RoundVerifier.reports_for

    def reports_for(self, verifier, nonce, parts, digests):
        out = honest(self, verifier, nonce, parts, digests)
        if self.me != liar:
            return out
        return [(r, d, Report(tuple(-v for v in rep.sketch), rep.distances)) if r != liar
                else (r, d, rep) for r, d, rep in out]

    monkeypatch.setattr(_verify.RoundVerifier, "reports_for", reports_for)


@pytest.mark.parametrize("codec", ["fp16", "topk", "qtopk"])
async def test_a_contributor_that_frames_honest_reducers_is_banned_and_their_parts_kept(
        monkeypatch, codec):
    frame(monkeypatch, 2)
    config = AllReduceConfig(codecs=CodecPolicy(large=codec, threshold=1000), chunk_values=1024)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, _ = await run_group(nodes, config, b"frame")
        flats = [torch.cat([t.flatten() for t in results[i].tensors]) for i in range(4)]
        for i in (0, 1, 3):
            # every part kept, bit-identical everywhere
            assert results[i].completed and torch.equal(flats[i], flats[0])
            assert [p.check for r, p in enumerate(results[i].parts) if r != i] == ["ok"] * 3
            stats = nodes[i].allreduce.statistics()
            # it disputed the two parts of the others that the liar lied about
            assert stats["disputes_opened"] == 2 == stats["disputes_cleared"]
            assert stats["report_lies"] == 1 and stats["parts_check_failed"] == 0
            assert nodes[i].flags.count(nodes[2].peer_id, "report_lie") == 1
            assert nodes[i].flags.is_banned(nodes[2].peer_id, "run", time.time())
            for r in (0, 1, 3):   # never an honest reducer
                assert nodes[i].flags.count(nodes[r].peer_id) == 0
        answered = sum(n.allreduce.statistics()["disputes_answered"] for n in nodes)
        assert answered == 6


async def test_a_reducer_that_does_not_answer_a_dispute_is_flagged_not_banned(monkeypatch):
    lying_reducer(monkeypatch, 3, 10.0)

    async def refuse(self, stream, target, dispute):
        raise RejectError("no_evidence", "kept nothing")

    monkeypatch.setattr(_service.AllReduceService, "_serve_dispute", refuse)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, _ = await run_group(nodes, CONFIG, b"silent")
        for i in range(3):
            assert results[i].parts[3].check == "failed"
            assert nodes[i].flags.count(nodes[3].peer_id, "reducer_check_failed") == 1
            assert nodes[i].flags.count(nodes[3].peer_id, "reducer_lie") == 0
            assert not nodes[i].flags.is_banned(nodes[3].peer_id, "run", time.time())


async def test_a_reducer_that_shows_false_evidence_is_proven_a_liar(monkeypatch):
    lying_reducer(monkeypatch, 3, 10.0)
    honest = _evidence.ReducerEvidence.disputed

    def disputed(self, verifier, plan, reports):
        # shows everyone, and a chunk of member 0 that is not what it committed to
        j, (digests, signature, payloads) = 0, self.committed[0]
        forged = bytearray(payloads[0])
        forged[0] ^= 1
        self.committed[j] = (digests, signature, (bytes(forged),) + tuple(payloads[1:]))
        honest(self, verifier, plan, reports)
        return sorted(c for c in self.committed if c != verifier)

    monkeypatch.setattr(_evidence.ReducerEvidence, "disputed", disputed)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        results, _ = await run_group(nodes, CONFIG, b"forged")
        for i in range(3):
            assert results[i].parts[3].check == "failed"
            assert nodes[i].flags.count(nodes[3].peer_id, "reducer_lie") == 1
            assert nodes[i].flags.is_banned(nodes[3].peer_id, "run", time.time())
            for r in range(3):
                assert nodes[i].flags.count(nodes[r].peer_id) == 0


async def test_an_uncommitted_sender_is_refused_at_once():
    config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000), chunk_values=1024,
                             sender_timeout=30.0, reducer_timeout=30.0)
    async with open_memory_nodes(2) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, clients={1}, tag=b"uncommitted")
        layout = Layout.for_tensors([3000], [1.0, 0.0], config.codecs, config.chunk_values,
                                    config.aggregator, config.caps)
        replies = []

        async def rogue():
            async with nodes[1].open_stream(nodes[0].peer_id, ALLREDUCE_PROTOCOL_ID) as stream:
                await stream.send_message(Begin(group.group_id, 1, 0, layout.digest, 1.0))
                item = await stream.receive(REDUCER_MESSAGES)
                replies.append(item[1] if isinstance(item, tuple) else item)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rogue)
            result = await nodes[0].allreduce.all_reduce(group, [torch.ones(3000)],
                                                         config=config)
        assert isinstance(replies[0], Reject) and replies[0].code == "uncommitted"
        assert 1 in result.excluded and result.contributors() == {0}
        assert trio.current_time() - start < config.sender_timeout
        assert nodes[0].allreduce.statistics()["senders_failed"] == 1


async def test_a_reducer_that_counts_itself_beyond_the_caps_is_proven_a_liar():
    """Member 3's reducer applies no weight cap and counts its own values 100
    times: its result is consistent with its claims, but the claims break the
    layout's caps, which no evidence can clear."""
    from .test_service import inputs

    class Greedy(PartReducer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.max_share, self.max_ratio = 1.0, None

    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        nodes[3].allreduce.part_reducer = Greedy
        group = make_group(nodes, tag=b"greedy")
        xs = inputs(4)
        results = {}

        async def one(i):
            results[i] = await nodes[i].allreduce.all_reduce(
                group, xs[i], weight=100.0 if i == 3 else 1.0, config=CONFIG)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        for i in range(3):
            assert results[i].parts[3].check == "failed"
            assert [p.check for r, p in enumerate(results[i].parts) if r not in (i, 3)] \
                == ["ok"] * 2
            assert nodes[i].flags.count(nodes[3].peer_id, "reducer_lie") == 1
            assert nodes[i].flags.is_banned(nodes[3].peer_id, "run", time.time())
            for r in range(3):
                assert nodes[i].flags.count(nodes[r].peer_id) == 0
