"""The butterfly all-reduce: over real nodes on loopback (one process), and its
timeouts (``sender_timeout``, ``reducer_timeout``, ``join_wait``) over
in-memory nodes in virtual time."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
import time

import pytest
import torch
import trio

from p2pdl.averaging import (
    ALLREDUCE_PROTOCOL_ID,
    Aggregator,
    AllReduceConfig,
    CodecPolicy,
    Group,
    GroupMemberInfo,
    Layout,
    get_codec,
    part_sizes,
)
from p2pdl.averaging.allreduce import default_fractions
from p2pdl.averaging.allreduce._evidence import chunk_digest, commitment_payload
from p2pdl.averaging.allreduce._messages import Begin
from p2pdl.errors import ConfigError
from p2pdl.testing import open_memory_nodes, open_memory_swarm, open_nodes
from p2pdl.wire import FrameKind, TensorHeader

#: These tests check the weighted mean (the default rule is CenteredClip).
MEAN = Aggregator()

pytestmark = pytest.mark.timeout(120)

EXACT = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"), chunk_values=1024,
                        sender_timeout=10.0, reducer_timeout=20.0, averaging_timeout=60.0)
SHAPES = [(1000,), (37, 29), (5,), (3, 1, 700), (1,)]


async def connect_all(nodes) -> None:
    """Every node knows every other's address (matchmaking's DHT view does that)."""
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            await a.connect(f"{b.addrs[0]}/p2p/{b.peer_id}")


def make_group(nodes, *, clients=(), auxiliary=(), fractions=None, tag=b"g") -> Group:
    members = tuple(GroupMemberInfo(n.peer_id, client_mode=i in clients, auxiliary=i in auxiliary)
                    for i, n in enumerate(nodes))
    return Group(hashlib.sha256(tag).digest(), "run", 1, members, fractions=fractions)


def inputs(count, shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(*shape, generator=gen) * (i + 1) for shape in shapes]
            for i in range(count)]


def weighted_mean(xs, weights, who):
    total = sum(weights[i] for i in who)
    return [sum(weights[i] * xs[i][j] for i in who) / total for j in range(len(xs[0]))]


async def run_all(nodes, group, xs, weights, config=EXACT, skip=(), **options):
    results = {}

    async def one(i):
        results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], weight=weights[i],
                                                         config=config, **options)

    async with trio.open_nursery() as nursery:
        for i in range(len(nodes)):
            if i not in skip:
                nursery.start_soon(one, i)
    return results


def max_error(outputs, truth) -> float:
    return max(float((o - t).abs().max() / max(1.0, float(t.abs().max())))
               for o, t in zip(outputs, truth, strict=True))


@pytest.mark.parametrize("count", [2, 3, 5, 8])
async def test_weighted_mean_is_exact_without_compression(count):
    async with open_nodes(count) as nodes:
        await connect_all(nodes)
        xs = inputs(count)
        weights = [1.0 + 2 * i for i in range(count)]
        # Three members weigh 1, 3 and 5: 5 is above half of 9, so the share cap
        # (max_weight_share 1/2) lowers it to 4, the sum of the others.
        counted = [1.0, 3.0, 4.0] if count == 3 else weights
        truth = weighted_mean(xs, counted, range(count))
        results = await run_all(nodes, make_group(nodes), xs, weights)
        for i, result in results.items():
            assert result.completed, [p.error for p in result.parts]
            assert [t.shape for t in result.tensors] == [x.shape for x in xs[i]]
            assert max_error(result.tensors, truth) < 1e-6
            assert result.contributors() == set(range(count))
            assert {c.weight for p in result.parts for c in p.contributions} == {sum(counted)}
            assert result.bytes_sent > 0 and result.bytes_received > 0
            assert set(result.times) >= {"scatter", "gather", "total"}
        # every member holds the very same values
        for result in results.values():
            for a, b in zip(result.tensors, results[0].tensors, strict=True):
                assert torch.equal(a, b)


async def test_a_second_round_and_inplace():
    totals = [0, 0, 0.0]
    async with open_nodes(3) as nodes:
        await connect_all(nodes)
        for round_ in range(2):
            xs = inputs(3, seed=round_)
            truth = weighted_mean(xs, [1, 1, 1], range(3))
            group = make_group(nodes, tag=b"round-%d" % round_)
            results = {}

            async def one(i, group=group, xs=xs, results=results):
                results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=EXACT,
                                                                 inplace=True)

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i)
            for i in range(3):
                assert results[i].tensors[0] is xs[i][0]
                assert max_error(xs[i], truth) < 1e-6
            totals[0] += results[0].bytes_sent
            totals[1] += results[0].bytes_received
            totals[2] += results[0].times["total"]
        stats = nodes[0].allreduce.statistics()
        assert stats["completed"] == 2
        # the counters of every round: bytes as the results say, seconds of the rounds
        assert (stats["bytes_sent"], stats["bytes_received"]) == tuple(totals[:2])
        assert stats["round_seconds"] == pytest.approx(totals[2]) and totals[2] > 0


@pytest.mark.parametrize("codec", ["fp16", "uint8", "uint4"])
async def test_codecs_stay_within_their_bounds_and_members_agree(codec):
    config = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large=codec, threshold=100),
                             chunk_values=4096,
                             averaging_timeout=30.0)
    shapes = [(20000,), (50,), (300, 40)]
    async with open_nodes(3) as nodes:
        await connect_all(nodes)
        xs = inputs(3, shapes)
        weights = [1.0, 2.0, 3.0]
        truth = weighted_mean(xs, weights, range(3))
        results = await run_all(nodes, make_group(nodes), xs, weights, config)
        c = get_codec(codec)
        for j, shape in enumerate(shapes):
            exact = math.prod(shape) < 100
            # each sender's values, then the average, travel through the codec once
            if exact:
                bound = 1e-5 * float(truth[j].abs().max())
            else:
                bound = (max(c.max_abs_error(xs[i][j]) for i in range(3))
                         + c.max_abs_error(truth[j]) * 1.01 + 1e-6)
            for result in results.values():
                error = float((result.tensors[j] - truth[j]).abs().max())
                assert error <= bound, (codec, j, error, bound)
                assert torch.equal(result.tensors[j], results[0].tensors[j])


@pytest.mark.parametrize("verify", [True, False])
async def test_the_sent_error_is_what_the_codecs_rounded_off_each_members_values(verify):
    """With ``sent_error=True`` each member learns, per value, its value less
    what the reducer decoded (0 on its own part and exact tensors): the mean
    of the values less their errors is then the result, up to the result's
    own trip through the codec."""
    config = AllReduceConfig(aggregator=MEAN, verify=verify, chunk_values=4096,
                             codecs=CodecPolicy(large="uint4", threshold=100),
                             averaging_timeout=30.0)
    shapes = [(20000,), (50,), (300, 40)]
    async with open_nodes(3) as nodes:
        await connect_all(nodes)
        xs = inputs(3, shapes)
        weights = [1.0, 2.0, 3.0]
        group = make_group(nodes)
        results = await run_all(nodes, group, xs, weights, config, sent_error=True)
        plain = await run_all(nodes, make_group(nodes, tag=b"plain"), xs, weights, config)
        assert all(r.sent_error is None for r in plain.values())
        received = [weighted_mean([[x - e for x, e in zip(xs[i], results[i].sent_error,
                                                          strict=True)] for i in range(3)],
                                  weights, range(3))]
        c = get_codec("uint4")
        for i, result in results.items():
            assert result.completed
            errors = result.sent_error
            assert [e.shape for e in errors] == [torch.Size(s) for s in shapes]
            assert torch.equal(errors[1], torch.zeros(50))    # an exact tensor
            flat = torch.cat([e.reshape(-1) for e in errors])
            lo, hi = result.parts[i].start, result.parts[i].end
            assert not flat[lo:hi].any()                         # its own part
            assert flat.abs().max() > 0
            x = torch.cat([t.reshape(-1) for t in xs[i]])
            # (a chunk's blocks start where the chunk does: bounded by the widest range)
            assert float(flat.abs().max()) <= float(x.max() - x.min()) / 30 * 1.001 + 1e-6
            for j in (0, 2):    # the mean of what was decoded, through the codec once more
                bound = c.max_abs_error(received[0][j]) * 1.01 + 1e-5
                error = float((result.tensors[j] - received[0][j]).abs().max())
                assert error <= bound, (i, j, error, bound)


@pytest.mark.parametrize("codec", ["topk", "qtopk"])
@pytest.mark.parametrize("rule", ["mean", "default"])
async def test_a_topk_round_averages_the_sparsified_values_exactly_and_verifies(rule, codec):
    """Under ``topk`` each member's values travel as their 8 largest of every
    256 (its own part too), and the result as the union of the contributors'
    positions: every member gets the average of the sparsified values up to
    fp16 rounding, bit-identical; with ``AllReduceConfig()``'s CenteredClip and
    verification every part checks out; ``sent_error`` is what the codec
    dropped of each member's values, everywhere."""
    config = AllReduceConfig(codecs=CodecPolicy(large=codec, threshold=100),
                             chunk_values=4096, averaging_timeout=30.0)
    if rule == "mean":
        config = dataclasses.replace(config, aggregator=MEAN)
    shapes = [(20000,), (50,), (300, 40)]
    topk = get_codec(codec)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        xs = inputs(4, shapes)
        weights = [1.0, 1.0, 1.0, 1.0]
        group = make_group(nodes)
        results = await run_all(nodes, group, xs, weights, config, sent_error=True)
        layout = Layout.for_tensors([math.prod(s) for s in shapes], default_fractions(group),
                                    config.codecs, config.chunk_values, config.aggregator)
        sparse = []   # each member's values as the codec carries them, chunk by chunk
        for member in xs:
            flat = torch.cat([x.reshape(-1) for x in member])
            for chunk in (c for part in layout.chunks for c in part):
                if chunk.codec == topk:
                    piece = flat[chunk.start:chunk.end]
                    topk.decode(topk.encode(piece), chunk.count, out=piece)
            sparse.append([piece.view(x.shape) for piece, x in zip(
                flat.split([x.numel() for x in member]), member, strict=True)])
        truth = weighted_mean(sparse, weights, range(4))
        for i, result in results.items():
            assert result.completed, [p.error for p in result.parts]
            for j, shape in enumerate(shapes):
                assert torch.equal(result.tensors[j], results[0].tensors[j])
                if rule == "mean":
                    bound = 2.0**-10 * float(truth[j].abs().max()) + 1e-6
                    assert float((result.tensors[j] - truth[j]).abs().max()) <= bound, (i, j)
                # nonzero only where some member's sparsified values are
                if math.prod(shape) >= 100:
                    union = torch.stack([s[j] != 0 for s in sparse]).any(0)
                    assert not result.tensors[j][~union].any()
                expected = xs[i][j] - sparse[i][j]
                assert torch.allclose(result.sent_error[j], expected, atol=1e-6), (i, j)
        stats = [n.allreduce.statistics() for n in nodes]
        assert sum(s["parts_failed"] for s in stats) == 0
        if rule == "default":
            assert sum(s["parts_check_failed"] + s["parts_unverifiable"] for s in stats) == 0
            assert sum(s["parts_checked"] for s in stats) == 4 * 3   # every other part


async def test_client_mode_and_auxiliary_members():
    # 0 full, 1 client (reduces nothing), 2 auxiliary (reduces, contributes nothing), 3 full
    async with open_nodes(4) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, clients={1}, auxiliary={2})
        assert default_fractions(group)[1] == 0.0
        xs = inputs(4)
        weights = [1.0, 2.0, 5.0, 3.0]
        truth = weighted_mean(xs, weights, [0, 1, 3])
        results = await run_all(nodes, group, xs, weights)
        for i in (0, 1, 3):
            assert results[i].completed
            assert max_error(results[i].tensors, truth) < 1e-6
            assert results[i].contributors() == {0, 1, 3}
        aux = results[2]
        lo, hi = aux.parts[2].start, aux.parts[2].end
        assert aux.parts[2].completed and hi > lo
        flat_truth = torch.cat([t.reshape(-1) for t in truth])
        flat_aux = torch.cat([t.reshape(-1) for t in aux.tensors])
        assert torch.allclose(flat_aux[lo:hi], flat_truth[lo:hi], atol=1e-6)
        assert not aux.parts[0].completed  # auxiliary peers receive no results...
        assert aux.auxiliary and aux.completed  # ...so only their own part counts
        assert results[1].parts[1].end == results[1].parts[1].start  # client: empty part


async def test_fractions_from_the_plan_size_the_parts():
    async with open_nodes(3) as nodes:
        await connect_all(nodes)
        fractions = (0.6, 0.1, 0.3)
        group = make_group(nodes, fractions=fractions)
        xs = inputs(3)
        results = await run_all(nodes, group, xs, [1.0, 1.0, 1.0])
        numel = sum(math.prod(s) for s in SHAPES)
        sizes = tuple(p.end - p.start for p in results[0].parts)
        assert sizes == part_sizes(numel, fractions)
        assert max_error(results[0].tensors, weighted_mean(xs, [1, 1, 1], range(3))) < 1e-6


async def misbehave(node, group, peers, how, *, weight=1.0):
    """Member ``node`` (a client: it reduces nothing) sends bad values to every reducer."""
    me = group.index_of(node.peer_id)
    async with trio.open_nursery() as nursery:
        for r, member in enumerate(group.members):
            if r == me or member.client_mode:
                continue

            async def one(r=r, member=member):
                async with node.open_stream(member.peer_id, ALLREDUCE_PROTOCOL_ID) as stream:
                    layout = peers[r]
                    chunk = layout.chunks[r][0]
                    good = torch.ones(chunk.count)
                    bad = good.clone()
                    bad[chunk.count // 2] = float("nan")
                    # a commitment to what it sends, so that what is refused is the values
                    digests = [chunk_digest(bad.numpy().tobytes())] * len(layout.chunks[r])
                    signature = node.host.libp2p.get_private_key().sign(
                        commitment_payload(group.group_id, r, me, layout.digest, digests))
                    await stream.send_message(Begin(group.group_id, me, r, layout.digest,
                                                    weight, chunks=digests,
                                                    commitment=signature))
                    if how == "nan":
                        await stream.send_tensor_chunk(chunk.header(), bad.numpy().tobytes())
                    elif how == "malformed":
                        header = TensorHeader(chunk.part, "float32", (chunk.part_numel,),
                                              chunk.start - chunk.part_start + 1, chunk.count)
                        await stream.send_tensor_chunk(header, good.numpy().tobytes())
                    elif how == "oversized":
                        # a frame header announcing 64 MiB: beyond any frame's limit
                        await stream._write(struct.pack(">BI", FrameKind.TENSOR, 64 << 20)
                                            + b"\0" * 1024)
                    elif how == "stall":
                        pass  # begins, then sends nothing
                    with trio.move_on_after(10):
                        await stream.wait_peer_done()

            nursery.start_soon(one)


@pytest.mark.parametrize("how", ["nan", "malformed", "oversized", "stall"])
async def test_bad_values_from_one_peer_are_rejected_and_the_round_completes(how, autojump_clock):
    # A silent sender waits out sender_timeout; a broken stream is dropped long before.
    sender_timeout = 1.5 if how == "stall" else 15.0
    config = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"), chunk_values=1024,
                             sender_timeout=sender_timeout, reducer_timeout=30.0,
                             averaging_timeout=40.0)
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, clients={3})
        xs = inputs(4)
        weights = [1.0, 2.0, 3.0, 4.0]
        truth = weighted_mean(xs, weights, [0, 1, 2])
        layout = Layout.for_tensors([x.numel() for x in xs[0]], default_fractions(group),
                                    config.codecs, config.chunk_values)
        start = trio.current_time()
        results = {}
        async with trio.open_nursery() as nursery:

            async def honest():
                results.update(await run_all(nodes, group, xs, weights, config, skip={3}))
                nursery.cancel_scope.cancel()

            nursery.start_soon(honest)
            # The honest members' rounds run before the bad one's streams arrive: a
            # stream broken before its ar.begin was read (a bad frame in the same
            # read) fails its member at once, it is not waited out as silent.
            await trio.sleep(0.1)
            nursery.start_soon(misbehave, nodes[3], group, [layout] * 4, how)
        elapsed = trio.current_time() - start
        for i in range(3):
            assert results[i].completed
            assert max_error(results[i].tensors, truth) < 1e-6
            assert 3 in results[i].excluded
            assert results[i].contributors() == {0, 1, 2}
        if how == "stall":
            assert config.sender_timeout <= elapsed < config.sender_timeout + 10.0
        else:
            assert elapsed < config.sender_timeout
        assert all(n.allreduce.statistics()["active"] == 0 for n in nodes)


async def test_different_tensors_are_refused_as_layout_mismatch_without_hanging(
        autojump_clock):
    config = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"), sender_timeout=1.0,
                             reducer_timeout=2.0, averaging_timeout=10.0)
    async with open_memory_nodes(2) as nodes:
        await connect_all(nodes)
        group = make_group(nodes)
        xs = [[torch.ones(100)], [torch.ones(101)]]
        with trio.fail_after(8):
            results = await run_all(nodes, group, xs, [1.0, 1.0], config)
        for i in range(2):
            assert not results[i].completed
            failed = [p for p in results[i].parts if not p.completed]
            assert any("layout_mismatch" in (p.error or "") for p in failed)
            # a part that did not complete keeps the member's own values
            assert torch.equal(results[i].tensors[0], xs[i][0])


async def test_centered_clip_bounds_a_scaling_member_and_every_member_agrees():
    config = AllReduceConfig(codecs=CodecPolicy(large="fp16", threshold=1000),
                             chunk_values=1024, aggregator=Aggregator("centered_clip", tau=1.0))
    async with open_nodes(4) as nodes:
        await connect_all(nodes)
        gen = torch.Generator().manual_seed(5)
        base = torch.randn(5000, generator=gen) * 0.01
        xs = [[base + torch.randn(5000, generator=gen) * 0.001] for _ in range(4)]
        xs[3] = [xs[3][0] * 1000]  # member 3 scales its gradients 1000x
        results = await run_all(nodes, make_group(nodes), xs, [1.0] * 4, config)
        honest = sum(x[0] for x in xs[:3]) / 3
        for result in results.values():
            assert result.completed, [p.error for p in result.parts]
            assert torch.equal(result.tensors[0], results[0].tensors[0])
        out = results[0].tensors[0]
        # per chunk within (1/3) * tau of the honest mean; the mean is 250x off
        layout = Layout.for_tensors([5000], default_fractions(make_group(nodes)),
                                    config.codecs, config.chunk_values, config.aggregator)
        for part in layout.chunks:
            for spec in part:
                lo, hi = spec.start, spec.end
                assert float((out[lo:hi] - honest[lo:hi]).norm()) <= 1.01 / 3 + 1e-3
        # a member averaging with another rule is refused, not mixed
        mixed = {i: config if i else EXACT for i in range(2)}
        group = make_group(nodes[:2], tag=b"mixed")

        async def one(i, out):
            out[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=mixed[i])

        outcome = {}
        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(one, i, outcome)
        assert not outcome[0].completed and not outcome[1].completed
        assert any("layout_mismatch" in (p.error or "") for p in outcome[0].parts)


async def test_a_member_whose_values_are_outliers_three_rounds_running_is_banned():
    config = AllReduceConfig(codecs=CodecPolicy(large="none"), chunk_values=1024,
                             aggregator=Aggregator("centered_clip", tau=1.0))
    async with open_nodes(4) as nodes:
        await connect_all(nodes)
        gen = torch.Generator().manual_seed(6)
        attacker = nodes[3].peer_id
        for round_ in range(4):
            xs = [[torch.randn(3000, generator=gen) * 0.01] for _ in range(4)]
            xs[3] = [torch.full((3000,), 100.0)]   # a constant direction, far away
            group = make_group(nodes, tag=b"ban-%d" % round_)
            results = await run_all(nodes, group, xs, [1.0] * 4, config)
            honest = [results[i] for i in range(3)]
            if round_ < 2:
                assert all(r.completed for r in honest)
                assert all(not n.flags.is_banned(attacker, "run", time.time())
                           for n in nodes[:3])
            if round_ == 2:  # the third outlier round bans it on every honest reducer
                for node in nodes[:3]:
                    assert node.flags.is_banned(attacker, "run", time.time())
                    assert node.allreduce.statistics()["outliers_flagged"] == 3
                    assert node.flags.count(attacker, "outlier_values") == 3
            if round_ == 3:  # banned: no honest reducer takes its values, nobody sends
                for r in honest:  # it any (its part keeps each member's own values)
                    assert all(3 not in seg.contributors for p in r.parts
                               for seg in p.contributions)
                    assert r.parts[3].error == "the reducer is banned from the run"
                    for part in r.parts[:3]:
                        assert part.completed
                        assert torch.equal(r.tensors[0][part.start:part.end],
                                           honest[0].tensors[0][part.start:part.end])
                # honest members do not flag each other
                for node in nodes[:3]:
                    for other in nodes[:3]:
                        assert node.flags.count(other.peer_id) == 0


async def test_bad_arguments_are_clear_errors():
    async with open_nodes(2) as nodes:
        group = make_group(nodes)
        service = nodes[0].allreduce
        for tensors, weight, match in [
            ([torch.ones(3)], float("nan"), "weight"),
            ([torch.ones(3)], -1.0, "weight"),
            ([torch.ones(3, dtype=torch.int64)], 1.0, "floating-point"),
            (torch.ones(3), 1.0, "sequence"),
            ([], 1.0, "empty"),
            ([torch.tensor([1.0, float("inf")])], 1.0, "NaN or infinite"),
        ]:
            with pytest.raises(ConfigError, match=match):
                await service.all_reduce(group, tensors, weight=weight)
        other = Group(b"x" * 32, "run", 1, (GroupMemberInfo(nodes[1].peer_id),))
        with pytest.raises(ConfigError, match="not a member"):
            await service.all_reduce(other, [torch.ones(3)])
        with pytest.raises(ConfigError):
            AllReduceConfig(sender_timeout=10, reducer_timeout=5)


async def test_streams_for_unknown_or_finished_groups_are_refused(autojump_clock):
    import dataclasses

    from p2pdl import NodeConfig
    from p2pdl.averaging.allreduce._messages import REDUCER_MESSAGES, Reject

    config = dataclasses.replace(NodeConfig(), allreduce=AllReduceConfig(join_wait=0.5))
    async with open_memory_nodes(2, config) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, tag=b"done-round")
        await run_all(nodes, group, inputs(2), [1.0, 1.0])

        async def begin(group_id):
            async with nodes[0].open_stream(nodes[1].peer_id, ALLREDUCE_PROTOCOL_ID) as stream:
                await stream.send_message(Begin(group_id, 0, 1, b"\0" * 32, 1.0))
                with trio.fail_after(5):
                    _, reply = await stream.receive_message(REDUCER_MESSAGES)
                assert isinstance(reply, Reject)
                return reply.code

        start = trio.current_time()
        assert await begin(b"\1" * 32) == "unknown_group"
        assert 0.4 < trio.current_time() - start < 3
        assert await begin(group.group_id) == "finished"
        assert nodes[1].allreduce.statistics()["streams_rejected"] == 2


async def test_a_waiting_stream_whose_sender_left_stops_waiting_at_once(autojump_clock):
    async with open_memory_nodes(2) as nodes:  # join_wait: the default 10 s
        await connect_all(nodes)
        async with nodes[0].open_stream(nodes[1].peer_id, ALLREDUCE_PROTOCOL_ID) as stream:
            await stream.send_message(Begin(b"\2" * 32, 0, 1, b"\0" * 32, 1.0))
            with trio.fail_after(5):
                while nodes[1].allreduce.statistics()["waiting"] == 0:
                    await trio.sleep(0.01)
            await stream.reset()
        start = trio.current_time()
        with trio.fail_after(5):
            while nodes[1].allreduce.statistics()["waiting"]:
                await trio.sleep(0.01)
        assert trio.current_time() - start < 1.0  # not join_wait


async def test_a_member_gone_before_the_round_is_not_waited_for(autojump_clock):
    """A member whose connection closed (it was killed as the group formed) is
    failed within LIVENESS_POLL, not after sender_timeout: the survivors' parts
    complete at once, and both lose the dead member's part alike."""
    async with open_memory_swarm() as swarm:
        nodes = await swarm.add_nodes(3)
        await connect_all(nodes)
        group = make_group(nodes)
        xs = inputs(3)
        swarm.kill(nodes[2])
        start = trio.current_time()
        results = await run_all(nodes, group, xs, [1.0, 1.0, 1.0], skip=(2,))
        assert trio.current_time() - start < EXACT.sender_timeout / 2
        for i in (0, 1):
            parts = results[i].parts
            assert [p.completed for p in parts] == [True, True, False]
            assert 2 in results[i].excluded or i == 1 or parts[0].contributions
        truth = weighted_mean(xs, [1.0, 1.0, 1.0], (0, 1))
        lo, hi = results[0].parts[0].start, results[0].parts[1].end
        flat = [torch.cat([t.flatten() for t in results[i].tensors])[lo:hi] for i in (0, 1)]
        assert torch.equal(flat[0], flat[1])
        assert torch.allclose(flat[0], torch.cat([t.flatten() for t in truth])[lo:hi])
        assert nodes[0].allreduce.statistics()["senders_excluded"] >= 1
