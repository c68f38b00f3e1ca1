"""The DHT's sans-IO core (``DHTState``): answers, replicas, republishing and
the table, driven with explicit times and no trio."""

from __future__ import annotations

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.dht import DHTConfig, DHTState, Record
from p2pdl.dht._messages import FindNode, FindValue, Nodes, Store, Stored, Value
from p2pdl.dht._state import StoreTally, to_wire
from p2pdl.errors import LocalProtocolError, RemoteProtocolError, RequestError

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


def peer() -> tuple[ID, object]:
    pair = create_new_key_pair()
    return ID.from_pubkey(pair.public_key), pair.private_key


def server_addrs(i: int) -> tuple[str, ...]:
    return (f"/ip4/127.0.0.1/tcp/{4000 + i}",)


def test_a_server_that_asks_enters_the_table_and_a_client_leaves_it():
    me, _ = peer()
    state = DHTState(me, DHTConfig())
    other, _ = peer()
    key = bytes(32)
    answer = state.answer(other, FindNode(key, True, server_addrs(1)), True, NOW, 5.0)
    assert isinstance(answer, Nodes) and answer.server
    assert len(state.table) == 1 and state.table_version == 1
    state.answer(other, FindNode(key, False, ()), True, NOW, 6.0)   # now a client
    assert len(state.table) == 0 and state.counters["requests"] == 2
    with pytest.raises(RemoteProtocolError, match="target of 3 bytes"):
        state.answer(other, FindNode(b"abc", True, ()), True, NOW, 7.0)
    with pytest.raises(RequestError):
        state.answer(other, FindValue("", False, ()), True, NOW, 7.0)


def test_a_store_is_kept_by_a_server_refused_by_a_client_and_found_again():
    me, key = peer()
    writer = DHTState(me, DHTConfig())
    item = writer.make_item("k", "v", NOW + 60, writer_subkey(me), NOW, key)
    server_id, _ = peer()
    server = DHTState(server_id, DHTConfig())
    request = Store("k", [to_wire(item)], False, ())
    assert server.answer(me, request, False, NOW, 1.0) == Stored(
        ["unavailable: this node is a DHT client"], False)
    assert server.answer(me, request, True, NOW, 1.0) == Stored([""], True)
    assert server.counters["items_stored"] == 1
    found = server.answer(me, FindValue("k", False, ()), True, NOW, 2.0)
    assert isinstance(found, Value) and len(found.items) == 1
    record = Record()
    assert writer.accept_items("k", found.items, server_id, record, NOW) is True
    result = writer.result("k", record, NOW)
    assert result is not None and result.dictionary
    assert result.value[writer_subkey(me)].value == "v"
    assert writer.result("k", record, NOW + 61) is None   # expired


def writer_subkey(peer_id: ID) -> str:
    from p2pdl.dht import owned_subkey

    return owned_subkey(peer_id)


def test_forged_items_are_dropped_and_counted():
    me, key = peer()
    victim, _ = peer()
    state = DHTState(me, DHTConfig())
    item = state.make_item("k", "v", NOW + 60, writer_subkey(me), NOW, key)
    wire = to_wire(item)
    forged = type(wire)(writer_subkey(victim), wire.value, wire.expiration, wire.signature)
    record = Record()
    assert state.accept_items("k", [forged], victim, record, NOW) is None
    assert state.counters["invalid_items_received"] == 1 and not record


def test_only_ones_own_subkey_is_written():
    me, key = peer()
    other, _ = peer()
    state = DHTState(me, DHTConfig())
    with pytest.raises(LocalProtocolError, match="belongs to peer"):
        state.make_item("k", "v", NOW + 60, writer_subkey(other), NOW, key)
    with pytest.raises(LocalProtocolError, match="keys are strings"):
        state.make_item(b"k", "v", NOW + 60, None, NOW, key)


def test_republishing_waits_its_interval_and_forgets_what_expired():
    me, key = peer()
    config = DHTConfig()
    state = DHTState(me, config)
    lasting = state.make_item("a", 1, NOW + 10 * config.republish_interval, None, NOW, key)
    brief = state.make_item("b", 2, NOW + 1, None, NOW, key)
    state.remember_published("a", lasting, 0.0)
    state.remember_published("b", brief, 0.0)
    assert state.republish_jobs(NOW, 1.0, False) == []
    later = config.republish_interval + 1
    jobs = state.republish_jobs(NOW + 2, later, False)
    assert jobs == [("a", [lasting], "republished")]
    assert list(state.published) == [("a", None)]          # the expired one forgotten
    assert state.republish_jobs(NOW + 3, later + 1, False) == []   # stored again just now


def test_a_server_among_the_nearest_keeps_a_replica():
    from p2pdl.dht import Contact

    me, _ = peer()
    state = DHTState(me, DHTConfig(replication=3))
    target = state.key ^ (1 << 200)          # this node's distance: 2**200
    ids = [peer()[0] for _ in range(6)]
    near = [Contact(p, target ^ (i + 1)) for i, p in enumerate(ids)]
    far = [Contact(p, target ^ ((1 << 201) + i)) for i, p in enumerate(ids)]
    assert state.replicas(target, near, server=False) == (near, False)
    assert state.replicas(target, near, server=True) == (near, False)    # 6 nearer than us
    assert state.replicas(target, far, server=True) == (far[:2], True)   # us and two more
    mixed = near[:1] + far
    assert state.replicas(target, mixed, server=True) == (mixed[:2], True)


def test_run_scoped_keys_belong_to_guarded_runs_only():
    me, _ = peer()
    state = DHTState(me, DHTConfig())
    state.scope_run_keys("p2pdl/progress/", lambda rest: rest.split("/")[0])
    state.scope_run_keys("p2pdl/progress/x/", lambda rest: "inner")
    assert state.run_of_key("p2pdl/progress/run1/snap") is None   # no run guarded yet
    state.set_run_guard(lambda run_id: run_id in {"run1", "inner"})
    assert state.run_of_key("p2pdl/progress/run1/snap") == "run1"
    assert state.run_of_key("p2pdl/progress/x/y") == "inner"       # the longest prefix
    assert state.run_of_key("p2pdl/progress/run2/snap") is None
    assert state.run_of_request(FindValue("p2pdl/progress/run1/a", False, ())) == "run1"
    assert state.run_of_request(FindNode(bytes(32), False, ())) is None


def test_a_store_returns_at_its_quorum_or_once_every_replica_answered():
    tally = StoreTally(3)
    tally.sent = 2                           # the two nearest confirmed so far
    assert not tally.answer(True) and not tally.answer(False)
    tally.sent += 2
    assert not tally.answer(True)
    assert tally.answer(True)                # three hold it: the quorum, lookup or not
    few = StoreTally(5)
    few.sent = 2
    assert not few.answer(True) and not few.answer(True)   # the lookup may bring more
    assert few.looked_up()                   # it brought none: all of them answered
    none = StoreTally(5)
    assert none.looked_up() and none.accepted == 0         # nobody to send to
    short = StoreTally(5)
    short.sent = 4
    assert not short.looked_up()             # quorum 4 of the 4 replicas
    assert [short.answer(True) for _ in range(4)] == [False, False, False, True]

