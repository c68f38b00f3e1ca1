"""State sync sans-IO (``_state``, ``_snapshots``, ``_downloads``): manifests, snapshots,
partial downloads, the chunk plan."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdl.errors import ConfigError, RemoteProtocolError
from p2pdl.service import check_run_id
from p2pdl.statesync import STATESYNC_PROTOCOL, Manifest, StateSyncConfig, vote_on_state
from p2pdl.statesync._downloads import (
    MAX_BUSY_BACKOFF,
    ChunkPlan,
    Failure,
    PartialStore,
)
from p2pdl.statesync._messages import ChunkReply, GetChunk, ManifestReply, Refused
from p2pdl.statesync._snapshots import (
    Snapshot,
    SnapshotTable,
)
from p2pdl.statesync._state import Exclusions, choose_manifest, chunk_count
from p2pdl.statesync.config import (
    DIGEST_SIZE,
    MAX_CHUNK_SIZE,
    MAX_CHUNKS,
    MIN_CHUNK_SIZE,
    MiB,
)
from p2pdl.wire import WireConfig, encode_message

pytestmark = pytest.mark.timeout(60)

KiB = 1024
CHUNK = MIN_CHUNK_SIZE


def config(**fields) -> StateSyncConfig:
    return StateSyncConfig(**{"chunk_size": CHUNK, "max_state_bytes": 64 * MiB, **fields})


def plan_for(payload: bytes, donors, store: PartialStore | None = None, run: str = "r",
             **fields) -> ChunkPlan:
    manifest = Manifest.build(3, payload, CHUNK)
    store = PartialStore(64 * MiB, 4) if store is None else store
    partial = store.open(run, manifest)
    return ChunkPlan(manifest, donors, config(**fields), partial,
                     store=lambda i, d: store.add(run, partial, i, d))


def serve(plan: ChunkPlan, payload: bytes, now: float = 0.0) -> None:
    """Answer every request the plan makes with the right chunk, until it is done."""
    for _ in range(10_000):
        requests = plan.next_requests(now)
        if not requests:
            break
        for index, donor in requests:
            start, end = plan.manifest.chunk_bounds(index)
            assert plan.on_chunk(index, donor, payload[start:end])
    assert plan.done


# -- config -------------------------------------------------------------------------


def test_config_defaults_fit_the_wire():
    defaults = StateSyncConfig()
    assert defaults.chunk_size == 512 * KiB and defaults.keep_snapshots == 2
    assert defaults.max_chunks <= MAX_CHUNKS
    limit = WireConfig().max_message_size
    assert defaults.manifest_message_bound() <= limit
    assert defaults.chunk_message_bound() <= limit
    # The hard limits themselves fit: the largest manifest and the largest chunk.
    assert MAX_CHUNKS * DIGEST_SIZE + 1024 <= limit and MAX_CHUNK_SIZE + 1024 <= limit


@pytest.mark.parametrize("fields, match", [
    ({"chunk_size": 1024}, "chunk_size"),
    ({"chunk_size": MAX_CHUNK_SIZE + 1}, "chunk_size"),
    ({"chunk_size": 64 * KiB, "max_state_bytes": 4 * 1024 * MiB}, "16384 chunks"),
    ({"keep_snapshots": 0}, "keep_snapshots"),
    ({"max_parallel_chunks": 1.5}, "max_parallel_chunks"),
    ({"max_runs": True}, "max_runs"),
    ({"fetch_timeout": 0}, "fetch_timeout"),
    ({"busy_backoff": float("nan")}, "busy_backoff"),
    ({"request_timeout": 400.0}, "request_timeout"),
    ({"max_chunks_per_donor": 9}, "max_chunks_per_donor"),
    ({"min_agreeing_donors": 0}, "min_agreeing_donors"),
    ({"min_agreeing_donors": 65}, "min_agreeing_donors"),
])
def test_config_rejects_bad_values(fields, match):
    with pytest.raises(ConfigError, match=match):
        StateSyncConfig(**fields)


def test_run_ids():
    assert check_run_id("r") == "r"
    for bad in ("", "x" * 129, 5, None):
        with pytest.raises(ConfigError):
            check_run_id(bad)


# -- manifests ----------------------------------------------------------------------


def test_manifest_chunks_and_checks():
    payload = os.urandom(3 * CHUNK + 10)
    m = Manifest.build(7, payload, CHUNK)
    assert (m.epoch, m.size, m.num_chunks) == (7, len(payload), 4)
    assert m.digest == hashlib.sha256(payload).digest()
    assert m.chunk_bounds(3) == (3 * CHUNK, 3 * CHUNK + 10)
    with pytest.raises(IndexError):
        m.chunk_bounds(4)
    for i in range(4):
        start, end = m.chunk_bounds(i)
        assert m.chunk_digest(i) == hashlib.sha256(payload[start:end]).digest()
        assert m.verify_chunk(i, payload[start:end])
    assert not m.verify_chunk(0, bytes([payload[0] ^ 0xFF]) + payload[1:CHUNK])
    assert not m.verify_chunk(3, payload[-10:] + b"x")  # a wrong length
    flipped = payload[:-1] + bytes([payload[-1] ^ 0xFF])
    assert m.verify_payload(payload) and not m.verify_payload(flipped)
    assert m.problem(64 * MiB) is None
    assert Manifest.build(7, bytearray(payload), CHUNK) == m
    assert Manifest.build(7, payload, CHUNK) != Manifest.build(8, payload, CHUNK)


@pytest.mark.parametrize("change, match", [
    ({"epoch": -1}, "epoch"),
    ({"chunk_size": 100}, "chunk_size"),
    ({"size": 0}, "size"),
    ({"size": 65 * MiB}, "max_state_bytes"),
    ({"digest": b"short"}, "digest"),
    ({"chunk_digests": b"\0" * 31}, "chunk digests"),
])
def test_manifest_problems(change, match):
    good = Manifest.build(1, os.urandom(2 * CHUNK), CHUNK)
    assert match in dataclasses.replace(good, **change).problem(64 * MiB)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 5 * MIN_CHUNK_SIZE + 17),
       chunk_size=st.integers(MIN_CHUNK_SIZE, 3 * MIN_CHUNK_SIZE),
       seed=st.integers(0, 2**32 - 1))
def test_chunking_and_reassembly_property(size, chunk_size, seed):
    """Any payload cut into chunks: the chunks tile it, each verifies, and
    reassembling them in any arrival order gives the payload back."""
    rng = random.Random(seed)
    payload = rng.randbytes(size)
    m = Manifest.build(seed % 100, payload, chunk_size)
    assert m.num_chunks == chunk_count(size, chunk_size) == -(-size // chunk_size)
    assert len(m.chunk_digests) == DIGEST_SIZE * m.num_chunks
    bounds = [m.chunk_bounds(i) for i in range(m.num_chunks)]
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    store = PartialStore(10 * MiB, 2)
    partial = store.open("r", m)
    order = list(range(m.num_chunks))
    rng.shuffle(order)
    for i in order:
        start, end = bounds[i]
        assert m.verify_chunk(i, payload[start:end])
        store.add("r", partial, i, payload[start:end])
    assert partial.complete and partial.payload() == payload
    assert m.verify_payload(partial.payload())
    assert m.problem(10 * MiB) is None


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 12 * MIN_CHUNK_SIZE), donors=st.integers(1, 5),
       seed=st.integers(0, 2**32 - 1))
def test_plan_completes_despite_random_failures_property(size, donors, seed):
    """Donors that fail or corrupt chunks at random: the plan either gets every
    chunk right or says why not; it never keeps a wrong chunk."""
    rng = random.Random(seed)
    payload = rng.randbytes(size)
    names = [f"d{i}" for i in range(donors)]
    plan = plan_for(payload, names, max_chunk_attempts=6, max_donor_failures=4)
    now = 0.0
    for _ in range(10_000):
        if plan.over:
            break
        requests = plan.next_requests(now)
        if not requests:
            assert plan.inflight == {} and plan.next_wakeup(now) is not None
            now = plan.next_wakeup(now)
            continue
        for index, donor in requests:
            start, end = plan.manifest.chunk_bounds(index)
            roll = rng.random()
            if roll < 0.15:
                plan.on_failure(index, donor, Failure.ERROR, now, "timeout")
            elif roll < 0.2:
                plan.on_failure(index, donor, Failure.BUSY, now)
            elif roll < 0.23:
                assert not plan.on_chunk(index, donor, b"\xff" + payload[start + 1:end])
            else:
                assert plan.on_chunk(index, donor, payload[start:end])
    assert plan.over
    for i, data in plan.partial.chunks.items():
        start, end = plan.manifest.chunk_bounds(i)
        assert data == payload[start:end]
    if plan.done:
        assert plan.partial.payload() == payload and plan.failed is None
    else:
        assert plan.failed


# -- choosing what to download ------------------------------------------------------


def test_choose_the_newest_epoch_then_the_majority():
    a5, b5 = (Manifest.build(5, os.urandom(CHUNK), CHUNK) for _ in range(2))
    old = Manifest.build(4, os.urandom(CHUNK), CHUNK)
    offers = {"p1": a5, "p2": b5, "p3": b5, "p4": old, "p5": old, "p6": old}
    assert choose_manifest(offers) == (b5, ("p2", "p3"))
    assert choose_manifest(offers, min_epoch=5) == (b5, ("p2", "p3"))
    assert choose_manifest(offers, min_epoch=6) is None
    assert choose_manifest({}) is None
    assert choose_manifest({"p4": old}, min_epoch=4) == (old, ("p4",))
    # A tie is broken by the digest, the same way for every fetcher.
    tie = choose_manifest({"p1": a5, "p2": b5})
    assert tie == choose_manifest({"p2": b5, "p1": a5})
    assert tie[0].digest == min(a5.digest, b5.digest)


# -- the donors' vote ---------------------------------------------------------------

H, L, M = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32   # honest, liar, another digest


@pytest.mark.parametrize("offers, limits, won, holders, losers, ahead, lone", [
    # two honest donors outvote a liar at their epoch
    ({"a": (5, H), "b": (5, H), "liar": (5, L)}, {}, (5, H), ("a", "b"), ("liar",), (), False),
    # a liar far past the quorum's epoch + 1 does not count, and is listed
    ({"a": (5, H), "liar": (10**6, L), "b": (5, H)}, {"max_epoch": 6}, (5, H), ("a", "b"),
     (), ("liar",), False),
    # without an upper limit, a lone claim of a newer epoch is outvoted all the same
    ({"a": (5, H), "b": (5, H), "liar": (10**6, L)}, {}, (5, H), ("a", "b"), (), (), False),
    # ...but two colluding liars win there: what max_epoch is for
    ({"a": (5, H), "b": (5, H), "x": (9, L), "y": (9, L)}, {}, (9, L), ("x", "y"), (), (),
     False),
    ({"a": (5, H), "b": (5, H), "x": (9, L), "y": (9, L)}, {"max_epoch": 6}, (5, H),
     ("a", "b"), (), ("x", "y"), False),
    # the newest epoch with agreement wins: quorum + 1 when two are there
    ({"a": (5, H), "b": (5, H), "c": (6, M), "d": (6, M)}, {"max_epoch": 6}, (6, M),
     ("c", "d"), (), (), False),
    # one peer a step ahead alone is no winner there; the quorum's epoch is
    ({"a": (5, H), "b": (5, H), "c": (6, M)}, {"max_epoch": 6}, (5, H), ("a", "b"), (), (),
     False),
    # a tie elects nobody; neither does a plurality without a majority
    ({"a": (5, H), "b": (5, H), "x": (5, L), "y": (5, L)}, {}, None, (), (), (), False),
    ({"a": (5, H), "b": (5, H), "x": (5, L), "y": (5, M), "z": (5, b"\x44" * 32)}, {}, None,
     (), (), (), False),
    # one donor alone is not enough while others exist, even at other epochs
    ({"a": (5, H), "b": (4, M)}, {"min_epoch": 5}, None, (), (), (), False),
    ({"a": (5, H), "b": (5, L)}, {}, None, (), (), (), False),
    # the only donor there is: its state, marked lone
    ({"a": (5, H)}, {"min_epoch": 5}, (5, H), ("a",), (), (), True),
    ({"a": (5, H), "liar": (99, L)}, {"max_epoch": 6}, (5, H), ("a",), (), ("liar",), True),
    ({"a": (4, H)}, {"min_epoch": 5}, None, (), (), (), False),
    ({"liar": (99, L)}, {"max_epoch": 6}, None, (), (), ("liar",), False),
    ({}, {}, None, (), (), (), False),
    # min_agreeing 3: two are not enough; 1: the majority is
    ({"a": (5, H), "b": (5, H), "c": (5, L)}, {"min_agreeing": 3}, None, (), (), (), False),
    ({"a": (5, H), "b": (5, L), "c": (5, L)}, {"min_agreeing": 1}, (5, L), ("b", "c"), ("a",),
     (), False),
])
def test_the_donors_vote(offers, limits, won, holders, losers, ahead, lone):
    vote = vote_on_state(offers, **limits)
    assert (vote.epoch, vote.digest) == (won or (None, None))
    assert vote.won == (won is not None) and bool(vote.reason) == (won is None)
    assert (vote.holders, vote.losers, vote.ahead, vote.lone) == (holders, losers, ahead, lone)


@given(st.dictionaries(st.sampled_from("abcdefg"), st.tuples(st.integers(0, 3),
                                                            st.sampled_from([H, L, M]))),
       st.integers(0, 3), st.integers(1, 3))
@settings(max_examples=200, deadline=None)
def test_a_winner_always_has_the_agreement_it_needs_property(offers, max_epoch, need):
    vote = vote_on_state(offers, max_epoch=max_epoch, min_agreeing=need)
    # The order of the offers changes nothing.
    again = vote_on_state(dict(reversed(list(offers.items()))), max_epoch=max_epoch,
                          min_agreeing=need)
    assert (again.epoch, again.digest, set(again.holders)) == \
        (vote.epoch, vote.digest, set(vote.holders))
    if not vote.won:
        return
    at_epoch = [d for d, (e, _) in offers.items() if e == vote.epoch]
    assert vote.epoch <= max_epoch and set(vote.holders) | set(vote.losers) == set(at_epoch)
    assert all(offers[d] == (vote.epoch, vote.digest) for d in vote.holders)
    if vote.lone:
        assert [d for d in offers if d not in vote.ahead] == list(vote.holders)
    else:
        assert len(vote.holders) >= need and 2 * len(vote.holders) > len(at_epoch)


def test_exclusions_are_per_run_and_epoch_and_bounded():
    book: Exclusions[str] = Exclusions(max_epochs=2, max_donors=2)
    assert book.add("r", 5, "liar") and not book.add("r", 5, "liar")
    assert book.excluded("r", 5, "liar")
    assert not book.excluded("r", 6, "liar") and not book.excluded("other", 5, "liar")
    book.add("r", 5, "x")
    book.add("r", 5, "y")   # two donors per epoch: the oldest goes
    assert book.of("r", 5) == ["x", "y"] and len(book) == 2
    book.add("r", 6, "z")
    book.add("r", 7, "z")   # two (run, epoch) pairs: the oldest goes
    assert book.of("r", 5) == [] and book.of("r", 7) == ["z"] and len(book) == 2


# -- the donor's table --------------------------------------------------------------


def snapshot(run: str, epoch: int, payload: bytes | None = None) -> Snapshot:
    payload = payload or os.urandom(CHUNK + epoch + 1)
    return Snapshot(run, Manifest.build(epoch, payload, CHUNK), payload)


def test_snapshot_table_keeps_the_newest_and_finds_by_digest():
    table = SnapshotTable(keep=2, max_runs=2)
    s1, s2, s3 = snapshot("a", 1), snapshot("a", 2), snapshot("a", 3)
    assert table.add(s1) == [] and table.add(s2) == []
    assert table.add(s3) == [s1]
    assert table.newest("a") is s3
    assert table.find("a", s2.manifest.digest) is s2
    assert table.find("a", s1.manifest.digest) is None
    assert table.find("b", s2.manifest.digest) is None
    with pytest.raises(ConfigError, match="behind"):
        table.add(snapshot("a", 2))
    # The same epoch again: the new one is the newest, the old one stays for its fetchers.
    s3b = snapshot("a", 3)
    assert table.add(s3b) == [s2]
    assert table.newest("a") is s3b and table.find("a", s3.manifest.digest) is s3
    # The same state again changes nothing; the same payload at a new epoch is kept once.
    assert table.add(Snapshot("a", s3b.manifest, s3b.payload)) == []
    s4 = Snapshot("a", Manifest.build(4, s3b.payload, CHUNK), s3b.payload)
    assert table.add(s4) == []
    assert table.newest("a") is s4 and table.find("a", s3.manifest.digest) is s3
    table.add(snapshot("b", 0))
    with pytest.raises(ConfigError, match="max_runs"):
        table.add(snapshot("c", 0))
    assert table.remove("a") == 2 and table.remove("a") == 0
    assert table.runs() == ["b"] and len(table) == 1
    assert snapshot("x", 0, b"0123456789" * 500).chunk(1) == (b"0123456789" * 500)[CHUNK:]


# -- partial downloads --------------------------------------------------------------


def test_partial_store_resumes_and_is_bounded():
    payload = os.urandom(4 * CHUNK)
    m = Manifest.build(1, payload, CHUNK)
    store = PartialStore(max_bytes=6 * CHUNK, max_runs=2)
    p = store.open("a", m)
    store.add("a", p, 0, payload[:CHUNK])
    store.add("a", p, 0, payload[:CHUNK])  # a duplicate counts once
    assert store.open("a", m) is p and len(p.chunks) == 1 and store.nbytes == CHUNK
    # Another state of the same run replaces it.
    other = Manifest.build(2, payload, CHUNK)
    q = store.open("a", other)
    assert q is not p and store.get("a") is q and store.nbytes == 0
    # Bytes: a new run's chunks push the least recently used run out.
    for i in range(4):
        store.add("a", q, i, payload[i * CHUNK:(i + 1) * CHUNK])
    r = store.open("b", m)
    for i in range(3):
        store.add("b", r, i, payload[i * CHUNK:(i + 1) * CHUNK])
    assert store.get("a") is None and store.nbytes == 3 * CHUNK
    # A partial dropped from the store still takes chunks (its fetch finishes).
    store.add("a", q, 0, payload[:CHUNK])
    assert q.complete
    # Runs: at most max_runs, least recently used out.
    store.open("c", m)
    store.open("d", m)
    assert store.get("b") is None and len(store) == 2
    store.discard("c", r)  # not c's partial: nothing happens
    assert store.get("c") is not None
    store.discard("c")
    assert store.get("c") is None


# -- the chunk plan -----------------------------------------------------------------


def test_plan_spreads_chunks_over_donors_within_the_limits():
    payload = os.urandom(12 * CHUNK)
    plan = plan_for(payload, ["a", "b", "c"], max_parallel_chunks=5, max_chunks_per_donor=2)
    first = plan.next_requests(0.0)
    assert [i for i, _ in first] == [0, 1, 2, 3, 4]
    assert [d for _, d in first] == ["a", "b", "c", "a", "b"]
    assert plan.next_requests(0.0) == []  # max_parallel_chunks in flight
    index, donor = first[0]
    assert plan.on_chunk(index, donor, payload[:CHUNK])
    assert plan.next_requests(0.0) == [(5, "c")]
    assert plan.next_requests(0.0) == []
    for index, donor in first[1:]:
        start, end = plan.manifest.chunk_bounds(index)
        plan.on_chunk(index, donor, payload[start:end])
    plan.on_chunk(5, "c", payload[5 * CHUNK:6 * CHUNK])
    serve(plan, payload)
    assert plan.partial.payload() == payload
    assert plan.contributors() == ("a", "b", "c")
    assert sum(plan.delivered.values()) == 12 and min(plan.delivered.values()) >= 3
    assert plan.next_requests(0.0) == []


def test_a_bad_chunk_drops_its_donor_and_is_asked_elsewhere():
    payload = os.urandom(4 * CHUNK)
    plan = plan_for(payload, ["liar", "honest"], max_chunks_per_donor=1)
    requests = {d: i for i, d in plan.next_requests(0.0)}
    assert not plan.on_chunk(requests["liar"], "liar", b"\0" * CHUNK)
    assert plan.dropped["liar"].startswith("bad") and plan.bad() == ["liar"]
    start, end = plan.manifest.chunk_bounds(requests["honest"])
    assert plan.on_chunk(requests["honest"], "honest", payload[start:end])
    serve(plan, payload)
    assert plan.delivered == {"liar": 0, "honest": 4}
    assert plan.contributors() == ("honest",)


def test_errors_retry_elsewhere_and_are_bounded():
    payload = os.urandom(2 * CHUNK)
    plan = plan_for(payload, ["a", "b"], max_chunk_attempts=3, max_donor_failures=10,
                    max_chunks_per_donor=1)
    assert plan.next_requests(0.0) == [(0, "a"), (1, "b")]
    plan.on_failure(0, "a", Failure.ERROR, 0.0, "timeout")
    # Chunk 0 waits for b (which has not failed it) rather than going back to a.
    assert plan.next_requests(0.0) == []
    plan.on_chunk(1, "b", payload[CHUNK:])
    assert plan.next_requests(0.0) == [(0, "b")]
    plan.on_failure(0, "b", Failure.ERROR, 0.0, "reset")
    # Both failed it once: either may try again.
    assert plan.next_requests(0.0) == [(0, "a")]
    plan.on_failure(0, "a", Failure.ERROR, 0.0, "timeout")
    assert plan.failed and "chunk 0 failed 3 times" in plan.failed
    assert plan.next_requests(0.0) == []


def test_donors_failing_in_a_row_are_dropped():
    payload = os.urandom(6 * CHUNK)
    plan = plan_for(payload, ["flaky", "good"], max_donor_failures=2,
                    max_chunks_per_donor=1)
    for _ in range(2):
        requests = plan.next_requests(0.0)
        for index, donor in requests:
            if donor == "flaky":
                plan.on_failure(index, donor, Failure.ERROR, 0.0, "unreachable")
            else:
                start, end = plan.manifest.chunk_bounds(index)
                plan.on_chunk(index, donor, payload[start:end])
    assert "flaky" in plan.dropped and "2 failures in a row" in plan.dropped["flaky"]
    serve(plan, payload)
    assert plan.contributors() == ("good",)


def test_busy_donors_rest_with_backoff_then_are_dropped():
    payload = os.urandom(3 * CHUNK)
    plan = plan_for(payload, ["busy"], busy_backoff=0.1, max_busy_refusals=4,
                    max_chunks_per_donor=1)
    now = 0.0
    rests = []
    for _ in range(3):
        [(index, donor)] = plan.next_requests(now)
        plan.on_failure(index, donor, Failure.BUSY, now)
        assert plan.next_requests(now) == []
        wake = plan.next_wakeup(now)
        rests.append(round(wake - now, 6))
        now = wake
    assert rests == [0.1, 0.2, 0.4]
    assert not plan.failed  # busy costs no attempt
    [(index, donor)] = plan.next_requests(now)
    plan.on_failure(index, donor, Failure.BUSY, now)
    assert plan.failed and "busy 4 times" in plan.failed
    long = plan_for(payload, ["b"], busy_backoff=1.5, max_busy_refusals=30,
                    max_chunks_per_donor=1)
    for now in range(3):
        [(index, _)] = long.next_requests(100.0 * now)
        long.on_failure(index, "b", Failure.BUSY, 100.0 * now)
    assert long.next_wakeup(200.0) == 200.0 + MAX_BUSY_BACKOFF


def test_gone_donors_and_resumed_chunks():
    payload = os.urandom(4 * CHUNK)
    store = PartialStore(64 * MiB, 4)
    plan = plan_for(payload, ["a", "b"], store=store)
    requests = plan.next_requests(0.0)
    (i0, d0), (i1, d1) = requests[0], requests[1]
    plan.on_chunk(i0, d0, payload[:CHUNK])
    plan.on_failure(i1, d1, Failure.GONE, 0.0)
    assert plan.gone() == [d1] and not plan.failed
    for index, donor in plan.next_requests(0.0):
        plan.on_failure(index, donor, Failure.GONE, 0.0)
    assert plan.failed and "no donor left" in plan.failed and sorted(plan.gone()) == ["a", "b"]
    # A later plan of the same state resumes from the verified chunk.
    again = plan_for(payload, ["c"], store=store)
    assert again.resumed == 1 and 0 not in [i for i, _ in again.next_requests(0.0)]
    assert ChunkPlan(again.manifest, [], config(), again.partial).failed


# -- messages -----------------------------------------------------------------------


def test_messages_round_trip_and_limits():
    m = Manifest.build(9, os.urandom(3 * CHUNK), CHUNK)
    for message in (ManifestReply.of(m), GetChunk("r", m.digest, 2),
                    ChunkReply(2, b"x" * CHUNK), Refused("busy", "later")):
        messages = STATESYNC_PROTOCOL.responses if not isinstance(message, GetChunk) \
            else STATESYNC_PROTOCOL.requests
        _, decoded = messages.decode(encode_message(message, 1))
        assert decoded == message
    assert ManifestReply.of(m).manifest() == m
    big = encode_message(ManifestReply(1, MAX_CHUNKS * MAX_CHUNK_SIZE, MAX_CHUNK_SIZE,
                                       b"\0" * 32, b"\0" * (MAX_CHUNKS * DIGEST_SIZE)), 1)
    assert len(big) <= WireConfig().max_message_size
    assert len(encode_message(ChunkReply(0, b"\0" * MAX_CHUNK_SIZE), 1)) <= \
        WireConfig().max_message_size
    for body in ({"run_id": "r", "digest": b"\0" * 33, "index": 0},
                 {"run_id": "r", "digest": b"\0" * 32, "index": MAX_CHUNKS},
                 {"run_id": "r" * 129, "digest": b"\0" * 32, "index": 0}):
        with pytest.raises(RemoteProtocolError):
            GetChunk.from_wire(body)
    with pytest.raises(RemoteProtocolError):
        ChunkReply.from_wire({"index": 0, "data": b"\0" * (MAX_CHUNK_SIZE + 1)})
