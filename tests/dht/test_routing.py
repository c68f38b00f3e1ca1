"""The DHT's key space and routing table (sans-IO)."""

from __future__ import annotations

import random

from p2pdl.dht import Contact, RoutingTable, bucket_index, distance, key_of
from p2pdl.dht._keys import random_key_in_bucket


def test_keys_and_buckets():
    assert key_of(b"peer") == key_of(b"peer") != key_of(b"peer2")
    assert 0 <= key_of(b"x") < 2**256
    assert bucket_index(0b1000, 0b1000) == -1
    assert bucket_index(0, 1) == 0 and bucket_index(0, 2**255) == 255
    rng = random.Random(3)
    local = rng.getrandbits(256)
    for index in (0, 7, 100, 255):
        key = random_key_in_bucket(local, index, rng.randbytes(32))
        assert bucket_index(local, key) == index
    assert distance(5, 3) == 6


def table_with(n: int, k: int = 4, seed: int = 0) -> tuple[RoutingTable, list[int]]:
    rng = random.Random(seed)
    table = RoutingTable(rng.getrandbits(256), k=k, replacement_cache=2)
    keys = [rng.getrandbits(256) for _ in range(n)]
    for i, key in enumerate(keys):
        table.seen(i, key, now=float(i))
    return table, keys


def test_full_bucket_keeps_old_contacts_and_caches_newcomers():
    table = RoutingTable(0, k=2, replacement_cache=2)
    far = [2**255 + i for i in range(5)]  # all in bucket 255
    assert table.seen("a", far[0], 0) and table.seen("b", far[1], 1)
    assert not table.seen("c", far[2], 2)  # bucket full: waits in the cache
    assert "c" not in table and len(table) == 2
    table.seen("a", far[0], 3)  # a answered again: still there, now most recent
    table.failed("b", far[1])
    assert "b" in table  # one failure is not enough
    table.failed("b", far[1])
    assert "b" not in table and "c" in table  # replaced from the cache


def test_closest_is_sorted_by_xor_distance():
    table, keys = table_with(200, k=20)
    target = random.Random(9).getrandbits(256)
    result = table.closest(target, 10)
    distances = [distance(c.key, target) for c in result]
    assert distances == sorted(distances) and len(result) == 10
    everyone = sorted(table.contacts(), key=lambda c: distance(c.key, target))
    assert [c.peer for c in result] == [c.peer for c in everyone[:10]]
    assert all(c.peer != result[0].peer for c in table.closest(target, 5, exclude=[result[0].peer]))


def test_self_is_never_added_and_refresh_keys_cover_stale_buckets():
    table = RoutingTable(12345, k=4, refresh_interval=100)
    assert not table.seen("me", 12345, 0)
    table.seen("x", 12345 ^ 2**200, 0)
    table.seen("y", 12345 ^ 2**10, 0)
    keys = table.buckets_to_refresh(now=500)
    indices = sorted(bucket_index(12345, key) for key in keys)
    assert indices[0] == 9 and indices[-1] == 200
    for key in keys:
        table.looked_up(key, 500)
    assert table.buckets_to_refresh(now=550) == []
    assert isinstance(table.get("x", 12345 ^ 2**200), Contact)
