"""Bandwidth caps of the emulated internet: configured vs measured TCP throughput.

    sudo python simulations/bench_netlab.py [--rates 10 50 100 1000] [--seconds 1] [--repeats 3]

Prints one JSON object: for each cap and direction (upload of a public host:
egress tbf; download of a private host behind a NAT: ingress IFB + tbf), the
median TCP payload rate of ``--repeats`` transfers lasting about
``--seconds`` each, and its ratio to the cap.  TCP payload can reach about
95.6 % of a cap counted in Ethernet frames.  Needs root (see docs/netlab.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from p2pdl import netlab
from p2pdl.netlab import Internet, NatType, measure_throughput


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 50, 100, 1000])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ok, reason = netlab.available()
    if not ok:
        print(reason, file=sys.stderr)
        return 1
    results = []
    with Internet() as net:
        relay = net.add_public_host("relay")  # uncapped: only the capped end limits
        gateway = net.add_nat("nat", NatType.ENDPOINT_INDEPENDENT)
        for i, rate in enumerate(args.rates):
            public = net.add_public_host(f"pub{i}", rate_mbit=rate)
            private = net.add_private_host(f"priv{i}", behind=gateway, rate_mbit=rate)
            nbytes = int(rate * 1e6 / 8 * args.seconds)
            for case, sender, receiver in (("upload, public host (egress tbf)", public, relay),
                                           ("download, private host (ingress IFB)", relay,
                                            private)):
                rates = [measure_throughput(sender, receiver, nbytes).mbit_per_s
                         for _ in range(args.repeats)]
                median = statistics.median(rates)
                results.append({"cap_mbit": rate, "case": case, "bytes": nbytes,
                                "measured_mbit": [round(r, 2) for r in rates],
                                "median_mbit": round(median, 2),
                                "ratio": round(median / rate, 4)})
        uncapped = measure_throughput(relay, net.add_public_host("other"), 200_000_000)
    print(json.dumps({"benchmark": "netlab caps", "repeats": args.repeats,
                      "uncapped_mbit": round(uncapped.mbit_per_s, 1), "results": results},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
