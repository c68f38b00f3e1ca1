"""Scale simulation of p2pdl's DHT routing: the real routing table and lookup code,
over a simulated network (no sockets).

    python simulations/dht_scale.py [--peers 10000] [--churn 0.2] [--lookups 1000]

Peers join one by one through a bootstrap peer (a lookup of their own key,
as a real node does), then ``--lookups`` records are stored at the k peers
nearest to their keys.  Then a fraction ``--churn`` of the peers leaves
without a word (others' tables still list them, as after the last refresh),
and every record is looked up from a random surviving peer.  A query to a
departed peer counts as a timeout.  Prints one JSON object:

* ``hops_p50``, ``hops_p95``: depth of the peer that returned the value
  (1 = one of the seeds the lookup started from);
* ``success_rate``: lookups that found their record;
* ``queries_p50``, ``queries_p95``: queries sent per lookup.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2pdl.dht import Contact, Lookup, RoutingTable  # noqa: E402


class SimNetwork:
    def __init__(self, k: int, alpha: int, rng: random.Random) -> None:
        self.k, self.alpha, self.rng = k, alpha, rng
        self.tables: dict[int, RoutingTable] = {}  # peer index -> table
        self.keys: dict[int, int] = {}
        self.alive: set[int] = set()
        self.stored: dict[int, dict[int, str]] = {}  # peer -> {record key: value}
        self.now = 0.0

    def add_peer(self, index: int) -> None:
        key = self.rng.getrandbits(256)
        self.keys[index] = key
        self.tables[index] = RoutingTable(key, k=self.k)
        self.alive.add(index)
        self.stored[index] = {}

    def contact(self, index: int) -> Contact:
        return Contact(index, self.keys[index])

    def lookup(self, origin: int, target: int, *, want_value: bool) -> Lookup:
        table = self.tables[origin]
        lookup = Lookup(target, table.closest(target), k=self.k, alpha=self.alpha,
                        stop_at_value=want_value, local=origin)
        while not lookup.done:
            batch = lookup.next_queries()
            if not batch:
                break
            for contact in batch:  # answers arrive; order does not matter here
                self.now += 0.001
                peer = contact.peer
                if peer not in self.alive:
                    lookup.on_failure(peer)
                    table.failed(peer, contact.key)
                    continue
                remote = self.tables[peer]
                remote.seen(origin, self.keys[origin], self.now)  # it learns about us
                table.seen(peer, contact.key, self.now)
                value = self.stored[peer].get(target) if want_value else None
                closer = [] if value is not None else remote.closest(target, exclude=(origin,))
                lookup.on_response(peer, closer, value)
        table.looked_up(target, self.now)
        return lookup

    def join(self, index: int, bootstrap: int) -> None:
        self.tables[index].seen(bootstrap, self.keys[bootstrap], self.now)
        self.lookup(index, self.keys[index], want_value=False)

    def refresh(self, index: int) -> None:
        for key in self.tables[index].buckets_to_refresh(self.now + 10**6,
                                                         self.rng.randbytes(32)):
            self.lookup(index, key, want_value=False)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    net = SimNetwork(args.k, args.alpha, rng)
    start = time.perf_counter()
    net.add_peer(0)
    for i in range(1, args.peers):
        net.add_peer(i)
        net.join(i, rng.randrange(i))
    for i in rng.sample(range(args.peers), min(args.peers, args.refreshers)):
        net.refresh(i)  # some peers ran their periodic bucket refresh
    build_s = time.perf_counter() - start

    records = []
    for n in range(args.lookups):
        key = rng.getrandbits(256)
        origin = rng.randrange(args.peers)
        found = net.lookup(origin, key, want_value=False).closest()
        for contact in found[: args.k]:
            net.stored[contact.peer][key] = f"value-{n}"
        records.append(key)

    gone = set(rng.sample(range(args.peers), int(args.churn * args.peers)))
    net.alive -= gone
    survivors = sorted(net.alive)
    hops, queries, found = [], [], 0
    for key in records:
        lookup = net.lookup(rng.choice(survivors), key, want_value=True)
        stats = lookup.stats()
        queries.append(stats.queries)
        if lookup.values:
            found += 1
            hops.append(stats.hops)
    return {
        "peers": args.peers,
        "churn": args.churn,
        "k": args.k,
        "alpha": args.alpha,
        "lookups": len(records),
        "hops_p50": percentile(hops, 0.5) if hops else None,
        "hops_p95": percentile(hops, 0.95) if hops else None,
        "success_rate": round(found / len(records), 4),
        "queries_p50": percentile(queries, 0.5),
        "queries_p95": percentile(queries, 0.95),
        "mean_table_size": round(statistics.mean(len(t) for t in net.tables.values()), 1),
        "build_s": round(build_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=10_000)
    parser.add_argument("--churn", type=float, default=0.2,
                        help="fraction of peers gone since their last refresh (default 0.2)")
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--alpha", type=int, default=3)
    parser.add_argument("--refreshers", type=int, default=0,
                        help="peers that also run a bucket refresh after joining (default 0)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 0 <= args.churn < 1 or args.peers < 2:
        parser.error("--churn must be in [0, 1) and --peers at least 2")
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
