"""Iterative lookups (sans-IO), alone and over a simulated network."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import random

from p2pdl.dht import Contact, Lookup, distance


def test_lookup_converges_to_the_k_nearest_with_alpha_in_flight():
    rng = random.Random(1)
    peers = {i: rng.getrandbits(64) for i in range(200)}
    target = rng.getrandbits(64)
    truth = sorted(peers, key=lambda p: distance(peers[p], target))[:5]

    def nearest_known_by(peer: int) -> list[Contact]:  # each peer knows 10 random others
        known = random.Random(peer).sample(sorted(peers), 10)
        known.sort(key=lambda p: distance(peers[p], target))
        return [Contact(p, peers[p]) for p in known[:5]]

    lookup = Lookup(target, [Contact(p, peers[p]) for p in range(3)], k=5, alpha=3)
    while not lookup.done:
        batch = lookup.next_queries()
        assert 0 < len(batch) <= 5 and lookup.in_flight <= 5
        for contact in batch:
            lookup.on_response(contact.peer, nearest_known_by(contact.peer) +
                               [Contact(q, peers[q]) for q in truth if q % 7 == contact.peer % 7])
    found = [c.peer for c in lookup.closest()]
    assert found == sorted(found, key=lambda p: distance(peers[p], target))
    assert set(found) <= set(peers) and len(found) == 5
    assert lookup.stats().hops >= 1


def test_alpha_in_flight_while_answers_bring_nearer_peers_then_all_k_at_once():
    far = [Contact(i, 1000 + i) for i in range(3)]
    near = [Contact(100 + i, i) for i in range(1, 9)]  # keys 1..8, target 0
    lookup = Lookup(0, far, k=6, alpha=2)
    first = lookup.next_queries()
    assert len(first) == 2
    lookup.on_response(first[0].peer, near)  # nearer peers: still alpha wide
    second = lookup.next_queries()
    assert [c.peer for c in second] == [near[0].peer] and lookup.in_flight == 2
    lookup.on_response(first[1].peer, near[:2])  # nothing nearer: converged
    rest = lookup.next_queries()
    assert [c.peer for c in rest] == [c.peer for c in near[1:6]]  # all at once
    assert lookup.in_flight == 6
    for contact in second + rest:
        lookup.on_response(contact.peer, [])
    assert lookup.done and lookup.next_queries() == []
    assert [c.peer for c in lookup.closest()] == [c.peer for c in near[:6]]


def test_confirmed_is_the_nearest_answered_up_to_the_first_that_has_not():
    """What a store may send to before the lookup is done: the nearest
    candidates that answered, in order, up to the first one that has not
    (or failed and was passed over)."""
    near = [Contact(100 + i, i) for i in range(1, 7)]  # keys 1..6, target 0
    lookup = Lookup(0, near, k=6, alpha=3)
    assert lookup.confirmed() == []
    first = lookup.next_queries()                      # keys 1, 2, 3
    lookup.on_response(first[1].peer, [])
    assert lookup.confirmed() == []                    # key 1 has not answered
    lookup.on_response(first[0].peer, [])
    assert [c.key for c in lookup.confirmed()] == [1, 2]
    lookup.on_failure(first[2].peer)                   # key 3 is out
    rest = lookup.next_queries()                       # converged? all of the rest
    assert [c.key for c in lookup.confirmed()] == [1, 2]
    lookup.on_response(rest[0].peer, [Contact(99, 0b10000)])   # a farther peer: no change
    assert [c.key for c in lookup.confirmed()] == [1, 2, rest[0].key]
    assert not lookup.done


def test_a_peer_that_answers_but_is_no_candidate_only_refers():
    lookup = Lookup(0, [Contact("client", 1)], k=2, alpha=1)
    (client,) = lookup.next_queries()
    lookup.on_response(client.peer, [Contact("a", 2), Contact("b", 3)], usable=False)
    for _ in range(10):
        for contact in lookup.next_queries():
            lookup.on_response(contact.peer, [])
    assert lookup.done and [c.peer for c in lookup.closest()] == ["a", "b"]


def test_failures_are_skipped_and_values_stop_a_get():
    contacts = [Contact(i, i) for i in range(1, 6)]
    lookup = Lookup(0, contacts, k=3, alpha=2, stop_at_value=True)
    first = lookup.next_queries()
    lookup.on_failure(first[0].peer)
    lookup.on_response(first[1].peer, [], value="v")
    assert lookup.done and lookup.values[0][1] == "v" and lookup.next_queries() == []
    assert lookup.stats().failures == 1 and lookup.stats().hops == 1


def test_late_or_unsolicited_answers_are_ignored_and_queries_are_bounded():
    lookup = Lookup(0, [Contact(i, i) for i in range(1, 100)], k=20, alpha=3, max_queries=6)
    lookup.on_response(42, [Contact(0, 0)], value="forged")  # never asked
    assert lookup.values == []
    sent = 0
    while not lookup.done:
        batch = lookup.next_queries()
        sent += len(batch)
        for c in batch:
            lookup.on_response(c.peer, [])
    assert sent == 6


def test_scale_simulation_small():
    path = pathlib.Path(__file__).resolve().parents[2] / "simulations" / "dht_scale.py"
    spec = importlib.util.spec_from_file_location("dht_scale", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = argparse.Namespace(peers=400, churn=0.2, lookups=100, k=20, alpha=3,
                              refreshers=0, seed=2)
    result = module.run(args)
    assert result["success_rate"] >= 0.99
    assert result["hops_p95"] <= 5
