"""NAT traversal benchmark in the emulated internet (p2pdl.netlab), as root.

    python simulations/bench_nat.py [--cap 100] [--mib 32]

Every host's link is capped at ``--cap`` Mbit/s (both directions).  Measures,
each with separate p2pdl processes inside network namespaces:

* ``direct_mbit_s``: public host to public host;
* ``relayed_mbit_s``: between two hosts behind port-randomising (symmetric)
  NATs, which can only talk through a public relay;
* ``holepunched_mbit_s``: between two hosts behind endpoint-independent NATs,
  after DCUtR upgraded their relayed connection to a direct one;
* ``relay_setup_s``: connecting to a private peer through the relay;
* ``holepunch_setup_s``: from that relayed connection to the direct one;
* ``raw_tcp_mbit_s``: one plain TCP transfer through the same caps (reference).

Prints one JSON object.  The kernel here has no netem: there is no added
delay or loss, only bandwidth caps and NAT.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2pdl import netlab  # noqa: E402
from p2pdl.netlab import Internet, NatType  # noqa: E402
from p2pdl.testing import open_agent  # noqa: E402

PORT = 4001


async def bench(args: argparse.Namespace) -> dict:
    cap = args.cap
    with Internet(term_timeout=2.0) as net:
        relay = net.add_public_host("relay", rate_mbit=cap)
        p1 = net.add_public_host("pub1", rate_mbit=cap)
        p2 = net.add_public_host("pub2", rate_mbit=cap)
        eim1, eim2 = net.add_nat("eim1"), net.add_nat("eim2")
        sym1, sym2 = net.add_nat("sym1", nat=NatType.SYMMETRIC), \
            net.add_nat("sym2", nat=NatType.SYMMETRIC)
        a, b = net.add_private_host("a", eim1, rate_mbit=cap), \
            net.add_private_host("b", eim2, rate_mbit=cap)
        c, d = net.add_private_host("c", sym1, rate_mbit=cap), \
            net.add_private_host("d", sym2, rate_mbit=cap)
        raw = netlab.measure_throughput(p1, p2, args.mib << 20)

        listen = ["--listen", f"/ip4/0.0.0.0/tcp/{PORT}"]

        def spawn(host, *extra):
            return open_agent([*listen, *extra], open_process=host.open_process)

        async with spawn(relay, "--relay") as r:
            boot = r.address_on(relay.ip)
            peers = [spawn(h, "--initial-peers", boot) for h in (p1, p2, a, b, c, d)]
            async with peers[0] as ap1, peers[1] as ap2, peers[2] as aa, peers[3] as ab, \
                    peers[4] as ac, peers[5] as ad:
                await ap2.command("connect", addr=ap1.address_on(p1.ip))
                direct = await ap2.command("send", peer=ap1.peer_id, mib=args.mib)

                circuit_c = await ac.wait_for_circuit()
                start = trio.current_time()
                await ad.command("connect", addr=circuit_c)
                relay_setup = trio.current_time() - start
                await trio.sleep(8)  # DCUtR tries and fails meanwhile (symmetric NATs)
                relayed = await ad.command("send", peer=ac.peer_id, mib=args.mib)

                circuit_a = await aa.wait_for_circuit()
                await ab.command("connect", addr=circuit_a)
                start = trio.current_time()
                await ab.command("wait_path", peer=aa.peer_id, path="hole-punched", timeout=60)
                holepunch_setup = trio.current_time() - start
                punched = await ab.command("send", peer=aa.peer_id, mib=args.mib)

    assert direct["path"] == "direct", direct
    assert relayed["path"] == "relayed", relayed
    assert punched["path"] == "hole-punched", punched
    return {
        "cap_mbit_s": cap,
        "mib_per_case": args.mib,
        "direct_mbit_s": round(direct["mbit_s"], 1),
        "relayed_mbit_s": round(relayed["mbit_s"], 1),
        "holepunched_mbit_s": round(punched["mbit_s"], 1),
        "raw_tcp_mbit_s": round(raw.mbit_per_s, 1),
        "relayed_vs_cap": round(relayed["mbit_s"] / cap, 3),
        "holepunched_vs_cap": round(punched["mbit_s"] / cap, 3),
        "relay_setup_s": round(relay_setup, 3),
        "holepunch_setup_s": round(holepunch_setup, 3),
        "note": "bandwidth caps and NAT only: this kernel has no netem (no delay or loss)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=100.0, help="Mbit/s per host (default 100)")
    parser.add_argument("--mib", type=int, default=32, help="MiB per transfer (default 32)")
    args = parser.parse_args()
    ok, reason = netlab.available()
    if not ok:
        print(json.dumps({"error": f"netlab unavailable: {reason}"}))
        sys.exit(1)
    print(json.dumps(trio.run(bench, args), indent=2))


if __name__ == "__main__":
    main()
