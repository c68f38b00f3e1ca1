"""The state-sync service on real nodes over loopback (in this process)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import pathlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgpack
import pytest
import trio

import p2pdl
from p2pdl import NodeConfig, open_node
from p2pdl.errors import (
    CallTimeoutError,
    ConfigError,
    LocalProtocolError,
    StateSyncError,
    StreamClosedError,
)
from p2pdl.statesync import (
    STATESYNC_PROTOCOL,
    STATESYNC_PROTOCOL_ID,
    StateDownload,
    StateSyncConfig,
)
from p2pdl.statesync import _fetcher as ss_fetcher
from p2pdl.statesync._messages import GetChunk, GetManifest, Refused
from p2pdl.statesync._service import STATESYNC_COUNTERS
from p2pdl.statesync.config import KiB, MiB
from p2pdl.testing import loopback_config, task_names, wait_until
from p2pdl.wire import FrameKind
from p2pdl.wire._frames import frame_header

pytestmark = pytest.mark.timeout(60)

RUN = "ss-run"
PAYLOAD = os.urandom(3 * MiB + 12345)
#: Small chunks, so that a download has enough of them to cut it short.
SMALL = StateSyncConfig(chunk_size=64 * KiB, max_state_bytes=256 * MiB)


def with_state_sync(config: StateSyncConfig) -> NodeConfig:
    return dataclasses.replace(NodeConfig(), statesync=config)


async def _run_node(config: NodeConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    with trio.CancelScope() as scope:
        async with open_node(loopback_config(config)) as node:
            task_status.started((node, scope))
            await trio.sleep_forever()


@asynccontextmanager
async def open_swarm(donors: int, config: StateSyncConfig | None = None
                     ) -> AsyncIterator[tuple[p2pdl.TrioNode, list, list[trio.CancelScope]]]:
    """A fetcher and ``donors`` donors connected to it; each donor can be killed
    by cancelling its scope."""
    node_config = with_state_sync(config or StateSyncConfig())
    async with trio.open_nursery() as nursery, open_node(loopback_config(node_config)) as fetcher:
        started = [await nursery.start(_run_node, node_config) for _ in range(donors)]
        for node, _ in started:
            await fetcher.connect(f"{node.addrs[0]}")
        yield fetcher, [n for n, _ in started], [s for _, s in started]
        nursery.cancel_scope.cancel()


def corrupt(node: p2pdl.TrioNode, run_id: str) -> None:
    """Make ``node`` serve chunks that do not match its manifest."""
    kept = node.statesync._table._runs[run_id]
    snapshot = kept[0]
    kept[0] = dataclasses.replace(snapshot, payload=bytes(b ^ 0x5A for b in snapshot.payload))


def count_chunks(node: p2pdl.TrioNode, on_chunk) -> None:
    """Call ``on_chunk(n)`` before ``node`` answers its n-th chunk request (from 1)."""
    answer = node.statesync._answer
    served = [0]

    def wrapped(ctx, request):
        if isinstance(request, GetChunk):
            served[0] += 1
            on_chunk(served[0])
        return answer(ctx, request)

    node.statesync._answer = wrapped


async def test_three_donors_share_the_download():
    async with open_swarm(3) as (fetcher, donors, _):
        for donor in donors:
            donor.statesync.share(RUN, 4, PAYLOAD)
        download = await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20)
        assert isinstance(download, StateDownload)
        assert download.payload == PAYLOAD and download.epoch == 4
        assert download.chunks == 7 and download.resumed_chunks == 0
        assert set(download.donors) == {d.peer_id for d in donors}
        served = [d.statesync.statistics()["chunks_served"] for d in donors]
        assert sum(served) == 7 and min(served) >= 2, served
        stats = fetcher.statistics()["statesync"]
        assert set(STATESYNC_COUNTERS) <= set(stats)
        assert stats["chunks_fetched"] == 7 and stats["bytes_fetched"] == len(PAYLOAD)
        assert stats["fetches_completed"] == 1 and stats["chunk_failures"] == 0
        assert stats["partial_downloads"] == 0 and stats["fetching"] == []
        assert donors[0].statesync.statistics()["runs"] == [RUN]
        assert repr(download).count("payload") == 0  # the payload is not printed


async def test_offers_list_each_donors_digest_and_fetch_takes_the_one_asked():
    import hashlib
    other = os.urandom(200 * KiB)
    async with open_swarm(3) as (fetcher, donors, _):
        donors[0].statesync.share(RUN, 4, PAYLOAD)
        donors[1].statesync.share(RUN, 4, PAYLOAD)
        donors[2].statesync.share(RUN, 4, other)
        offers = await fetcher.statesync.offers(RUN, [d.peer_id for d in donors]
                                                 + [fetcher.peer_id])
        assert offers == {donors[0].peer_id: (4, hashlib.sha256(PAYLOAD).digest()),
                          donors[1].peer_id: (4, hashlib.sha256(PAYLOAD).digest()),
                          donors[2].peer_id: (4, hashlib.sha256(other).digest())}
        # the majority wins without a digest; the minority's state when asked for
        download = await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20,
                                                  digest=hashlib.sha256(other).digest())
        assert download.payload == other and download.donors == (donors[2].peer_id,)
        with pytest.raises(StateSyncError):
            await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20,
                                           digest=bytes(32))
        with pytest.raises(ConfigError):
            await fetcher.statesync.fetch(RUN, [donors[0].peer_id], digest=b"short")
        assert await fetcher.statesync.offers("no-such-run", [donors[0].peer_id]) == {}


async def test_a_donor_serving_corrupt_chunks_is_dropped():
    async with open_swarm(3, SMALL) as (fetcher, donors, _):
        for donor in donors:
            donor.statesync.share(RUN, 2, PAYLOAD)
        corrupt(donors[1], RUN)
        download = await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20)
        assert download.payload == PAYLOAD
        assert donors[1].peer_id not in download.donors
        assert set(download.donors) == {donors[0].peer_id, donors[2].peer_id}
        stats = fetcher.statesync.statistics()
        assert stats["bad_chunks"] >= 1 and stats["donors_dropped"] == 1


async def test_a_manifest_that_lies_about_the_digest_loses_its_donors(monkeypatch):
    # Large payloads are assembled and hashed in a worker thread: take that path.
    monkeypatch.setattr(ss_fetcher, "THREAD_HASH_THRESHOLD", 1024)
    async with open_swarm(3, SMALL) as (fetcher, donors, _):
        for donor in donors:
            donor.statesync.share(RUN, 2, PAYLOAD)
        # Two donors offer a manifest whose chunks are right but whose digest is
        # not the payload's: they outvote the honest one, and the whole fails.
        for liar in donors[:2]:
            kept = liar.statesync._table._runs[RUN]
            kept[0] = dataclasses.replace(kept[0], manifest=dataclasses.replace(
                kept[0].manifest, digest=bytes(32)))
        download = await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20)
        assert download.payload == PAYLOAD and download.donors == (donors[2].peer_id,)
        # The liars caught, the honest donor is the only one left: unconfirmed.
        assert not download.confirmed and download.agreeing == 1
        stats = fetcher.statesync.statistics()
        assert stats["bad_manifests"] == 2 and stats["manifest_requests"] == 4
        for liar in donors[:2]:
            assert fetcher.flags.count(liar.peer_id, "state_digest_mismatch") == 1
        assert fetcher.flags.count(donors[2].peer_id) == 0
        # Not used again at this epoch: they are not even asked for chunks.
        with pytest.raises(StateSyncError, match="caught lying at epoch 2"):
            await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors[:2]], timeout=20)
        assert fetcher.statesync.statistics()["bad_manifests"] == 2


def served(node: p2pdl.TrioNode) -> tuple[int, int]:
    stats = node.statesync.statistics()
    return stats["manifests_served"], stats["chunks_served"]


@pytest.mark.parametrize("liar_epoch", [10**6, 4])   # far past the quorum; the same epoch
async def test_a_lying_donor_among_two_honest_ones_is_outvoted_flagged_and_not_used_again(
        liar_epoch):
    poison = os.urandom(len(PAYLOAD))   # as big as the honest state: only the vote tells
    async with open_swarm(3, SMALL) as (fetcher, donors, _):
        liar, honest = donors[0], donors[1:]
        liar.statesync.share(RUN, liar_epoch, poison)
        for donor in honest:
            donor.statesync.share(RUN, 4, PAYLOAD)
        ids = [d.peer_id for d in donors]
        download = await fetcher.statesync.fetch(RUN, ids, min_epoch=4, max_epoch=5,
                                                  timeout=20)
        assert download.payload == PAYLOAD and download.epoch == 4
        assert download.confirmed and download.agreeing == 2
        assert set(download.donors) == {d.peer_id for d in honest}
        assert served(liar)[1] == 0   # no chunk of the poison was asked for
        assert fetcher.flags.count(liar.peer_id, "state_lost_vote") == 1
        assert [fetcher.flags.count(d.peer_id) for d in honest] == [0, 0]
        stats = fetcher.statesync.statistics()
        assert stats["donors_flagged"] == 1 and stats["offers_excluded"] == 0
        # Again at this epoch: the liar's offer is not counted, and it is not flagged twice.
        again = await fetcher.statesync.fetch(RUN, ids, min_epoch=4, max_epoch=5, timeout=20)
        assert again.payload == PAYLOAD and served(liar)[1] == 0
        assert fetcher.statesync.statistics()["offers_excluded"] == 1
        assert fetcher.flags.count(liar.peer_id) == 1
        # Without the liar's vote the honest pair still needs each other: one of
        # them alone is not taken while the other offers another state.
        honest[1].statesync.share(RUN, 5, os.urandom(100 * KiB))
        with pytest.raises(StateSyncError, match="agreeing"):
            await fetcher.statesync.fetch(RUN, ids, min_epoch=4, max_epoch=5, timeout=20)


async def test_colluding_liars_past_the_quorum_are_ignored_but_win_without_a_limit():
    poison = os.urandom(200 * KiB)
    async with open_swarm(4, SMALL) as (fetcher, donors, _):
        for liar in donors[:2]:
            liar.statesync.share(RUN, 900, poison)
        for donor in donors[2:]:
            donor.statesync.share(RUN, 7, PAYLOAD)
        ids = [d.peer_id for d in donors]
        # A fetch that is told nothing of the run's epoch takes the newest agreement.
        unlimited = await fetcher.statesync.fetch(RUN, ids, timeout=20)
        assert unlimited.payload == poison and unlimited.epoch == 900
        assert fetcher.flags.flagged() == {}
        download = await fetcher.statesync.fetch(RUN, ids, min_epoch=7, max_epoch=8,
                                                  timeout=20)
        assert download.payload == PAYLOAD
        assert [fetcher.flags.count(d.peer_id, "state_lost_vote") for d in donors] == \
            [1, 1, 0, 0]
        # Caught at epoch 900: not used for it again, even by a fetch without a limit.
        with pytest.raises(StateSyncError, match="caught lying at epoch 900"):
            await fetcher.statesync.fetch(RUN, ids[:2], timeout=20)


async def test_a_donor_whose_chunks_do_not_match_its_offer_is_flagged_and_not_used_again():
    async with open_swarm(3, SMALL) as (fetcher, donors, _):
        for donor in donors:
            donor.statesync.share(RUN, 2, PAYLOAD)
        corrupt(donors[1], RUN)   # offers PAYLOAD's digest, serves other bytes
        ids = [d.peer_id for d in donors]
        download = await fetcher.statesync.fetch(RUN, ids, timeout=20)
        assert download.payload == PAYLOAD and donors[1].peer_id not in download.donors
        assert fetcher.flags.count(donors[1].peer_id, "state_digest_mismatch") == 1
        assert fetcher.flags.count(donors[0].peer_id) == fetcher.flags.count(
            donors[2].peer_id) == 0
        chunks = served(donors[1])[1]
        again = await fetcher.statesync.fetch(RUN, ids, timeout=20)
        assert again.payload == PAYLOAD and served(donors[1])[1] == chunks
        assert again.confirmed and again.agreeing == 2
        # At another epoch it is asked again (and caught again).
        for donor in donors:
            donor.statesync.share(RUN, 3, PAYLOAD[::-1])
        corrupt(donors[1], RUN)
        third = await fetcher.statesync.fetch(RUN, ids, min_epoch=3, timeout=20)
        assert third.payload == PAYLOAD[::-1]
        assert fetcher.flags.count(donors[1].peer_id, "state_digest_mismatch") == 2


async def test_a_lone_donor_is_taken_unconfirmed_and_logged(caplog):
    async with open_swarm(2) as (fetcher, donors, _):
        donors[0].statesync.share(RUN, 3, PAYLOAD)
        ids = [d.peer_id for d in donors]   # the other donor offers nothing of the run
        with caplog.at_level("WARNING", logger="p2pdl.statesync._fetcher"):
            download = await fetcher.statesync.fetch(RUN, ids, min_epoch=3, timeout=20)
        assert download.payload == PAYLOAD and not download.confirmed
        assert download.agreeing == 1
        assert any("only one donor" in r.getMessage() and "unconfirmed" in r.getMessage()
                   for r in caplog.records if r.levelname == "WARNING")
        assert fetcher.statesync.statistics()["lone_donor_fetches"] == 1
        # Two donors that disagree: nobody wins, nobody is flagged.
        donors[1].statesync.share(RUN, 3, PAYLOAD[::-1])
        with pytest.raises(StateSyncError, match="at least 2 agreeing donors"):
            await fetcher.statesync.fetch(RUN, ids, min_epoch=3, timeout=20)
        assert fetcher.flags.flagged() == {}
        assert fetcher.statesync.statistics()["votes_failed"] == 1


async def test_a_donor_dying_mid_download_is_replaced():
    async with open_swarm(3, SMALL) as (fetcher, donors, scopes):
        for donor in donors:
            donor.statesync.share(RUN, 2, PAYLOAD)
        # The donor dies as it is asked for its third chunk: the requests it holds fail.
        count_chunks(donors[0], lambda n: n == 3 and scopes[0].cancel())
        download = await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20)
        assert download.payload == PAYLOAD and download.chunks == 49
        stats = fetcher.statesync.statistics()
        assert stats["chunk_failures"] >= 1 and stats["donors_dropped"] >= 1
        assert {donors[1].peer_id, donors[2].peer_id} <= set(download.donors)


async def test_an_interrupted_download_resumes():
    async with open_swarm(1, SMALL) as (fetcher, donors, _):
        donors[0].statesync.share(RUN, 6, PAYLOAD)
        service = fetcher.statesync
        call = service._call
        let_through = [6]   # chunk requests answered before the rest hang

        async def gated_call(peer, protocol, request, timeout=None, *, run_id=None):
            if isinstance(request, GetChunk):
                if let_through[0] <= 0:
                    await trio.sleep_forever()   # until the fetch is given up
                let_through[0] -= 1
            return await call(peer, protocol, request, timeout, run_id=run_id)

        service._call = gated_call
        with pytest.raises(CallTimeoutError):
            await service.fetch(RUN, [donors[0].peer_id], timeout=2.0)
        kept = service.statistics()
        assert kept["partial_downloads"] == 1 and 0 < kept["partial_bytes"] < len(PAYLOAD)
        assert kept["fetches_failed"] == 1
        # Cancelled from outside, the chunks verified so far are kept too.
        let_through[0] = 6
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(service.fetch, RUN, [donors[0].peer_id]))
            await wait_until(
                lambda: service.statistics()["partial_bytes"] > kept["partial_bytes"], 10)
            nursery.cancel_scope.cancel()
        assert service.statistics()["partial_bytes"] > kept["partial_bytes"]
        service._call = call
        fetched_before = service.statistics()["chunks_fetched"]
        download = await service.fetch(RUN, [donors[0].peer_id], timeout=20)
        assert download.payload == PAYLOAD and download.epoch == 6
        assert 0 < download.resumed_chunks < download.chunks
        stats = service.statistics()
        assert stats["chunks_fetched"] - fetched_before == download.chunks - \
            download.resumed_chunks
        assert stats["resumed_chunks"] == download.resumed_chunks
        assert stats["partial_downloads"] == 0


async def test_a_donor_moving_on_makes_the_fetcher_read_manifests_again():
    async with open_swarm(1, SMALL) as (fetcher, donors, _):
        donor = donors[0]
        donor.statesync.share(RUN, 1, PAYLOAD)
        newer = os.urandom(200 * KiB)

        def move_on(n: int) -> None:
            if n == 3:  # two newer epochs: the one being fetched is no longer kept
                donor.statesync.share(RUN, 2, os.urandom(100 * KiB))
                donor.statesync.share(RUN, 3, newer)

        count_chunks(donor, move_on)
        download = await fetcher.statesync.fetch(RUN, [donor.peer_id], timeout=20)
        assert download.epoch == 3 and download.payload == newer
        stats = fetcher.statesync.statistics()
        assert stats["gone_answers"] >= 1 and stats["manifest_requests"] == 2
        assert donor.statesync.statistics()["snapshots_dropped"] == 1


async def test_busy_donors_are_retried_later(monkeypatch):
    config = dataclasses.replace(SMALL, max_concurrent_uploads=1, max_chunks_per_donor=4,
                                 busy_backoff=0.01)
    # Slow links: a chunk reply takes a moment to be written, so a fetcher's next
    # requests arrive while it is in flight (on loopback that is a race otherwise).
    from p2pdl.wire import FramedStream

    write = FramedStream._write

    async def slow_write(self, frame):
        if len(frame) > 32 * KiB:
            await trio.sleep(0.02)
        await write(self, frame)

    monkeypatch.setattr(FramedStream, "_write", slow_write)
    async with open_swarm(2, config) as (fetcher, donors, _):
        for donor in donors:
            donor.statesync.share(RUN, 1, PAYLOAD)
        download = await fetcher.statesync.fetch(RUN, [d.peer_id for d in donors], timeout=20)
        assert download.payload == PAYLOAD
        refused = sum(d.statesync.statistics()["busy_refusals"] for d in donors)
        assert refused >= 1  # two of a fetcher's requests arrive before a reply is written
        assert fetcher.statesync.statistics()["busy_answers"] == refused


async def test_nothing_suitable_offered_is_a_state_sync_error():
    async with open_swarm(2) as (fetcher, donors, _):
        ids = [d.peer_id for d in donors]
        with pytest.raises(StateSyncError, match="no donor offers.*refused unknown_run"):
            await fetcher.statesync.fetch(RUN, ids, timeout=10)
        with pytest.raises(StateSyncError, match="no donor"):
            await fetcher.statesync.fetch(RUN, [], timeout=10)
        with pytest.raises(StateSyncError, match="no donor"):
            await fetcher.statesync.fetch(RUN, [fetcher.peer_id], timeout=10)  # itself
        donors[0].statesync.share(RUN, 3, b"state")
        with pytest.raises(StateSyncError, match="epoch 4 or newer.*offered epochs: 3"):
            await fetcher.statesync.fetch(RUN, ids, min_epoch=4, timeout=10)
        download = await fetcher.statesync.fetch(RUN, ids, min_epoch=3, timeout=10)
        assert download.payload == b"state" and download.donors == (donors[0].peer_id,)
        donors[0].statesync.unshare(RUN)
        donors[0].statesync.unshare(RUN)  # idempotent
        with pytest.raises(StateSyncError):
            await fetcher.statesync.fetch(RUN, ids, timeout=10)
        assert fetcher.statesync.statistics()["fetches_failed"] == 5


async def test_bad_arguments():
    config = StateSyncConfig(chunk_size=64 * KiB, max_state_bytes=MiB, max_runs=2)
    async with open_node(loopback_config(with_state_sync(config))) as node:
        service = node.statesync
        service.share(RUN, 5, b"x" * 1000)
        for args, match in [(("", 1, b"x"), "run_id"), ((RUN, -1, b"x"), "epoch"),
                            ((RUN, True, b"x"), "epoch"), ((RUN, 6, "text"), "bytes"),
                            ((RUN, 6, b""), "1 to"), ((RUN, 6, b"x" * (MiB + 1)), "1 to"),
                            ((RUN, 4, b"x"), "behind")]:
            with pytest.raises(ConfigError, match=match):
                service.share(*args)
        service.share(RUN, 5, bytearray(b"y" * 10))  # the same epoch again: replaces it
        service.share("other", 0, memoryview(b"z" * 10))
        with pytest.raises(ConfigError, match="max_runs"):
            service.share("third", 0, b"z")
        assert service.shared_epoch(RUN) == 5 and service.shared_epoch("none") is None
        for kwargs, match in [({"min_epoch": -1}, "min_epoch"), ({"timeout": 0}, "timeout"),
                              ({"min_epoch": 3, "max_epoch": 2}, "max_epoch"),
                              ({"max_epoch": True}, "max_epoch"),
                              ({"timeout": "1"}, "timeout")]:
            with pytest.raises(ConfigError, match=match):
                await service.fetch(RUN, [node.peer_id], **kwargs)
        with pytest.raises(ConfigError, match="peer id"):
            await service.fetch(RUN, ["not-a-peer"])
        with pytest.raises(ConfigError, match="sequence"):
            await service.fetch(RUN, node.peer_id)
        with pytest.raises(ConfigError, match="run_id"):
            await service.fetch("", [node.peer_id])
    with pytest.raises(ConfigError, match="max_message_size"):
        async with open_node(loopback_config(dataclasses.replace(
                NodeConfig(), wire=p2pdl.WireConfig(max_message_size=256 * KiB)))):
            pass


async def test_one_fetch_per_run_at_a_time():
    async with open_swarm(1, SMALL) as (fetcher, donors, _):
        donors[0].statesync.share(RUN, 1, PAYLOAD)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetcher.statesync.fetch, RUN, [donors[0].peer_id])
            with trio.fail_after(5):
                while RUN not in fetcher.statesync.statistics()["fetching"]:
                    await trio.sleep(0.001)
            with pytest.raises(LocalProtocolError, match="already running"):
                await fetcher.statesync.fetch(RUN, [donors[0].peer_id])
            nursery.cancel_scope.cancel()


async def test_bad_requests_are_refused_or_reset_and_the_node_keeps_serving():
    async with open_swarm(1) as (attacker, donors, _):
        victim = donors[0]
        victim.statesync.share(RUN, 1, PAYLOAD)
        manifest = await attacker.call(victim.peer_id, STATESYNC_PROTOCOL, GetManifest(RUN))
        digest = manifest.digest
        for request, code in [(GetManifest("unknown"), "unknown_run"),
                              (GetChunk("unknown", digest, 0), "unknown_run"),
                              (GetChunk(RUN, b"\1" * 32, 0), "gone"),
                              (GetChunk(RUN, digest, 7), "bad_index")]:
            reply = await attacker.call(victim.peer_id, STATESYNC_PROTOCOL, request)
            assert isinstance(reply, Refused) and reply.code == code, (request, reply)
        bad_bodies = [
            ["ss.get_chunk", {"run_id": RUN, "digest": b"\0" * 33, "index": 0}],
            ["ss.get_chunk", {"run_id": RUN, "digest": digest, "index": -1}],
            ["ss.get_chunk", {"run_id": RUN, "digest": b"\0" * 5, "index": 0}],  # too short
            ["ss.get_chunk", {"run_id": "", "digest": digest, "index": 0}],
            ["ss.get_manifest", {"run_id": "r" * 500}],
            ["ss.get_manifest", {"run_id": ""}],
            ["ss.get_manifest", {"run_id": 5}],
            ["ss.chunk", {"index": 0, "data": b"x" * 2000}],  # a response as a request
            ["ss.nonsense", {}],
        ]
        for tag, body in bad_bodies:
            payload = msgpack.packb([tag, 1, body], use_bin_type=True)
            async with attacker.open_stream(victim.peer_id, STATESYNC_PROTOCOL_ID) as stream:
                await stream._send_frame(frame_header(FrameKind.MESSAGE, len(payload)) + payload)
                with pytest.raises(StreamClosedError), trio.fail_after(5):
                    await stream.receive_message(STATESYNC_PROTOCOL.responses)
        # An oversized message (over the wire's limit) resets the stream too.
        async with attacker.open_stream(victim.peer_id, STATESYNC_PROTOCOL_ID) as stream:
            size = 2 * MiB
            await stream._send_frame(frame_header(FrameKind.MESSAGE, size) + b"\0" * 1024)
            with pytest.raises(StreamClosedError), trio.fail_after(5):
                await stream.receive_message(STATESYNC_PROTOCOL.responses)
        download = await attacker.statesync.fetch(RUN, [victim.peer_id], timeout=20)
        assert download.payload == PAYLOAD
        assert victim.statesync.statistics()["refusals"] == 4
    assert not any("_get_chunk" in name or "_download" in name for name in task_names())


def test_sync_and_asyncio_faces_from_plain_threads():
    import asyncio

    config = with_state_sync(SMALL)
    with p2pdl.Node(config, listen=["/ip4/127.0.0.1/tcp/0"]) as donor, \
            p2pdl.Node(config, listen=["/ip4/127.0.0.1/tcp/0"]) as fetcher:
        fetcher.connect(donor.addrs[0], timeout=10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # share from another thread
            pool.submit(donor.statesync.share, RUN, 8, PAYLOAD).result(10)
        with pytest.raises(ConfigError, match="behind"):
            donor.statesync.share(RUN, 7, PAYLOAD)
        download = fetcher.statesync.fetch(RUN, [donor.peer_id], min_epoch=8, timeout=20)
        assert download.payload == PAYLOAD and download.donors == (donor.peer_id,)
        assert fetcher.statesync.statistics()["fetches_completed"] == 1
        with pytest.raises(StateSyncError):
            fetcher.statesync.fetch(RUN, [str(donor.peer_id)], min_epoch=9, timeout=20)

        async def aio() -> StateDownload:
            donor.aio.statesync.share(RUN, 9, PAYLOAD[::-1])
            stats = await fetcher.aio.statesync.statistics()
            assert stats["fetches"] == 2
            return await fetcher.aio.statesync.fetch(RUN, [donor.peer_id], timeout=20)

        download = asyncio.run(aio())
        assert download.epoch == 9 and download.payload == PAYLOAD[::-1]
        donor.statesync.unshare(RUN)
        fetcher.aio.statesync.unshare(RUN)
    with pytest.raises(p2pdl.NodeClosedError):
        donor.statesync.share(RUN, 10, b"x")


GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "statesync.md"


def test_the_guide_example_runs_and_its_table_matches_the_defaults(capsys):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    exec(compile(blocks[0], "docs/statesync.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.splitlines() == ["5 True", "4 2"]
    table = GUIDE.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    defaults = StateSyncConfig()
    for field in dataclasses.fields(StateSyncConfig):
        row = re.search(rf"^\| `{field.name}` \| ([0-9.]+)", table, re.M)
        assert row and float(row.group(1)) == getattr(defaults, field.name), field.name
