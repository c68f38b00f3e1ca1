"""Records, the merge rule, validation and the bounded store (sans-IO, no network)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.dht import (
    DHTConfig,
    InvalidRecord,
    Item,
    Record,
    RecordStore,
    Schema,
    Validator,
    owned_subkey,
    owner_of,
)
from p2pdl.dht._records import merge
from p2pdl.dht._validation import encode_value, sign
from p2pdl.errors import ConfigError, LocalProtocolError
from p2pdl.wire import Message

NOW = 1_000_000.0


def v(obj) -> bytes:
    return msgpack.packb(obj)


def store(**config) -> RecordStore:
    cfg = DHTConfig(**config)
    return RecordStore(cfg, Validator(cfg))


def test_later_expiration_wins_for_one_subkey_and_subkeys_coexist():
    s = store()
    assert s.put("k", Item("a", v(1), NOW + 10), NOW) == ""
    assert s.put("k", Item("b", v(2), NOW + 5), NOW) == ""
    assert s.put("k", Item("a", v(3), NOW + 20), NOW) == ""
    assert s.put("k", Item("a", v(4), NOW + 15), NOW).startswith("older")
    got = {i.subkey: msgpack.unpackb(i.value) for i in s.get("k", NOW)}
    assert got == {"a": 3, "b": 2}
    # Storing the same item again is fine (a republish): the node holds it.
    assert s.put("k", Item("a", v(3), NOW + 20), NOW) == ""


def test_equal_expirations_are_broken_by_value_the_same_everywhere():
    a, b = Item(None, v("x"), NOW + 10), Item(None, v("y"), NOW + 10)
    assert merge([a, b]).items() == merge([b, a]).items() == [max(a, b, key=lambda i: i.value)]


def test_a_dictionary_shows_when_a_subkey_outlives_the_plain_value():
    s = store()
    assert s.put("k", Item(None, v("plain"), NOW + 10), NOW) == ""
    assert s.put("k", Item("a", v(1), NOW + 5), NOW).startswith("older")
    assert s.put("k", Item("a", v(1), NOW + 10), NOW).startswith("older")  # a tie: plain wins
    assert s.put("k", Item("a", v(1), NOW + 11), NOW) == ""
    assert [i.subkey for i in s.get("k", NOW)] == ["a"]
    # The hidden plain value is still the bar later subkeys must clear...
    assert s.put("k", Item("b", v(2), NOW + 9), NOW).startswith("older")
    # ...until it expires.
    assert [i.subkey for i in s.get("k", NOW + 10.5)] == ["a"]
    s.prune(NOW + 10.5)
    assert s.put("k", Item("b", v(2), NOW + 12), NOW + 10.5) == ""
    # A plain value that outlives every subkey replaces the dictionary.
    assert s.put("k", Item(None, v("plain"), NOW + 12), NOW + 10.5) == ""
    assert [i.subkey for i in s.get("k", NOW + 10.5)] == [None]
    assert s.bytes == Item(None, v("plain"), 0).size and s.item_count == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "a", "b", "c"]), st.integers(0, 3),
                          st.integers(1, 30)), min_size=1, max_size=12), st.randoms())
def test_any_order_of_the_same_items_gives_the_same_record(writes, rnd):
    items = [Item(sk, v(val), NOW + exp) for sk, val, exp in writes]
    shuffled = list(items)
    rnd.shuffle(shuffled)
    one, two = merge(items), merge(shuffled)
    assert sorted(one.items(), key=repr) == sorted(two.items(), key=repr)
    # A store that saw them in either order holds the same too.
    s1, s2 = store(), store()
    for item in items:
        s1.put("k", item, NOW)
    for item in shuffled:
        s2.put("k", item, NOW)
    assert sorted(s1.get("k", NOW), key=repr) == sorted(s2.get("k", NOW), key=repr)
    held = s1.record("k").held() if "k" in s1 else []
    assert sorted(held, key=repr) == sorted(s2.record("k").held() if "k" in s2 else [], key=repr)
    assert s1.bytes == s2.bytes == sum(i.size for i in held)


def test_expired_items_vanish_and_are_pruned():
    s = store()
    s.put("k", Item("a", v(1), NOW + 1), NOW)
    s.put("k", Item("b", v(2), NOW + 5), NOW)
    s.put("gone", Item(None, v(3), NOW + 1), NOW)
    assert [i.subkey for i in s.get("k", NOW + 2)] == ["a", "b"][1:]
    assert s.prune(NOW + 2) == 1 and "gone" not in s and len(s) == 1
    assert s.item_count == 1 and s.bytes == Item("b", v(2), 0).size
    assert s.prune(NOW + 6) == 1 and len(s) == 0 and s.bytes == 0 and s.item_count == 0


def test_expiry_heap_stays_bounded_under_republishing():
    s = store()
    for n in range(5000):
        s.put("k", Item("a", v(n), NOW + 100 + n), NOW)
    assert s.item_count == 1
    assert len(s._expiry) <= 4 * s.item_count + 65


def test_store_bounds():
    s = store(max_keys=2, max_subkeys=2, max_value_size=100, max_record_size=300,
              max_storage_bytes=500)
    assert s.put("k1", Item("a", v("x" * 50), NOW + 10), NOW) == ""
    assert s.put("k1", Item("b", v("x" * 50), NOW + 10), NOW) == ""
    assert s.put("k1", Item("c", v(1), NOW + 10), NOW).startswith("full")  # subkeys
    assert s.put("k2", Item(None, v(1), NOW + 10), NOW) == ""
    assert s.put("k3", Item(None, v(1), NOW + 10), NOW).startswith("full")  # keys
    assert s.put("k1", Item("a", v("x" * 200), NOW + 11), NOW).startswith("too_large")
    big = store(max_value_size=100, max_record_size=150)
    big.put("k", Item("a", v("x" * 90), NOW + 10), NOW)
    assert big.put("k", Item("b", v("x" * 90), NOW + 10), NOW).startswith("full")  # record
    # Replacing a subkey by a same-size value is not growth.
    assert big.put("k", Item("a", v("y" * 90), NOW + 11), NOW) == ""


def test_expirations_in_the_past_or_too_far_ahead_are_refused():
    s = store(max_ttl=100)
    assert s.put("k", Item(None, v(1), NOW - 1), NOW).startswith("expired")
    assert s.put("k", Item(None, v(1), NOW), NOW).startswith("expired")
    assert s.put("k", Item(None, v(1), NOW + 101), NOW).startswith("too_far_ahead")
    assert s.put("k", Item(None, v(1), float("nan")), NOW).startswith("expired")
    assert s.put("k", Item(None, b"\xc1", NOW + 1), NOW).startswith("bad_value")
    assert s.put("", Item(None, v(1), NOW + 1), NOW).startswith("bad_key")
    assert s.put("k" * 257, Item(None, v(1), NOW + 1), NOW).startswith("bad_key")
    assert len(s) == 0


# -- owned subkeys and signatures ------------------------------------------------


def identity():
    key_pair = create_new_key_pair()
    return key_pair, ID.from_pubkey(key_pair.public_key)


def signed(key_pair, peer, key, value, expiration, name=""):
    subkey = owned_subkey(peer, name)
    raw = v(value)
    return Item(subkey, raw, expiration, sign(key_pair.private_key, key, subkey, raw, expiration))


def test_owned_subkeys_need_their_owners_signature():
    (alice_keys, alice), (mallory_keys, _) = identity(), identity()
    s = store()
    good = signed(alice_keys, alice, "k", "mine", NOW + 10)
    assert owner_of(good.subkey) == alice
    assert s.put("k", good, NOW) == ""
    # Mallory signs with her own key but claims Alice's subkey.
    forged = signed(mallory_keys, alice, "k", "forged", NOW + 20)
    assert forged.subkey == good.subkey
    assert s.put("k", forged, NOW).startswith("bad_signature")
    # A signature is bound to key, subkey, value and expiration.
    for change in ({"value": v("other")}, {"expiration": NOW + 30}):
        assert s.put("k", dataclasses.replace(good, **change), NOW).startswith("bad_signature")
    assert s.put("other-key", good, NOW).startswith("bad_signature")
    assert s.put("k", dataclasses.replace(good, signature=b""), NOW).startswith("bad_signature")
    assert s.put("k", dataclasses.replace(good, signature=b"\x00" * 3), NOW).startswith(
        "bad_signature")
    assert [msgpack.unpackb(i.value) for i in s.get("k", NOW)] == ["mine"]
    # Named owned subkeys work the same; unowned subkeys carry no signature.
    assert s.put("k", signed(alice_keys, alice, "k", 1, NOW + 10, name="x"), NOW) == ""
    assert s.put("k", Item("plain", v(1), NOW + 10, b"sig"), NOW).startswith("bad_signature")
    assert s.put("k", Item("@not-a-peer", v(1), NOW + 10), NOW).startswith("bad_owner")


class Progress(Message, tag="test.progress"):
    epoch: int
    samples: int


def test_schemas_check_values_dictionaries_and_signatures():
    (alice_keys, alice) = identity()
    cfg = DHTConfig()
    validator = Validator(cfg, (Schema("run/progress", Progress, dictionary=True,
                                       signed_subkeys=True),
                                Schema("run/", dictionary=False)))
    s = RecordStore(cfg, validator)
    ok = Progress(3, 128)
    raw = encode_value(ok)
    subkey = owned_subkey(alice)
    item = Item(subkey, raw, NOW + 10, sign(alice_keys.private_key, "run/progress/x", subkey,
                                              raw, NOW + 10))
    assert s.put("run/progress/x", item, NOW) == ""
    assert validator.decode("run/progress/x", raw) == ok
    bad = v({"epoch": "three", "samples": 1})
    assert s.put("run/progress/x", Item("@x", bad, NOW + 10), NOW).startswith("bad_owner")
    assert s.put("run/progress/x", Item("free", raw, NOW + 10), NOW).startswith("schema")
    assert s.put("run/progress/x", Item(None, raw, NOW + 10), NOW).startswith("schema")
    wrong = Item(subkey, bad, NOW + 10, sign(alice_keys.private_key, "run/progress/x", subkey,
                                              bad, NOW + 10))
    assert "epoch" in s.put("run/progress/x", wrong, NOW)
    # The longest prefix wins: "run/other" holds plain values only.
    assert s.put("run/other", Item(None, v(1), NOW + 10), NOW) == ""
    assert s.put("run/other", Item("a", v(1), NOW + 10), NOW).startswith("schema")
    assert s.put("elsewhere", Item("a", bad, NOW + 10), NOW) == ""


def test_schema_and_config_misuse_is_a_clear_error():
    with pytest.raises(LocalProtocolError, match="Message subclass"):
        Schema("x", value_type=dict)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="signed subkeys"):
        Schema("x", dictionary=False, signed_subkeys=True)
    with pytest.raises(ConfigError, match="mode"):
        DHTConfig(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_record_size"):
        DHTConfig(max_record_size=10**7)
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        encode_value(object())
    with pytest.raises(InvalidRecord):
        owner_of("@" + "1" * 40)


def test_record_verdicts():
    r = Record()
    a = Item("a", v(1), NOW + 1)
    assert r.verdict(a) == "new" and r.offer(a) and r.verdict(a) == "same"
    assert not r.offer(Item("a", v(0), NOW + 1))
    assert r.expiration == NOW + 1


def test_many_random_writers_converge_at_every_replica():
    rng = random.Random(5)
    writes = [Item(f"s{rng.randrange(20)}", v(rng.randrange(100)), NOW + rng.randrange(1, 50))
              for _ in range(300)]
    stores = [store() for _ in range(4)]
    for s in stores:
        order = list(writes)
        rng.shuffle(order)
        for item in order:
            s.put("k", item, NOW)
    views = [sorted(s.get("k", NOW), key=repr) for s in stores]
    assert all(view == views[0] for view in views)
    assert len(views[0]) == len({i.subkey for i in writes})
    for a, b in itertools.pairwise(views):
        assert a == b
