"""hivemind's side of bench_dht.py.  Runs in hivemind's own environment
(simulations/_baselines.py), so it imports nothing of p2pdl; from the
repository root:

    <hivemind venv>/bin/python -m simulations._hivemind_dht --nodes 32 --settle 5

It speaks simulations/_harness.py's protocol.  It first waits for the
command ``{"command": "run", "plan": [...]}`` -- a JSON list of ``{"op":
"store"|"get", "node", "key", "value", "ttl", "latest"}`` -- then starts
``--nodes`` hivemind DHT peers on loopback (each its own process and Go
daemon, as hivemind runs them; all join through the first), waits
``--settle`` seconds, runs the plan one operation at a time through the
public ``hivemind.DHT`` API, shuts every peer down and sends ``{"event":
"result", "startup_s", "results": [{"ok", "ms"}...]}``: a store is ok when
it returned True, a get when it returned the stored value.
"""

from __future__ import annotations

import argparse
import sys
import time

from simulations import _harness as harness

PLAN_TIMEOUT = 60.0  # seconds for the parent's plan to arrive


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--settle", type=float, default=5.0)
    args = parser.parse_args()
    with harness.reporting():
        run(args)


def run(args: argparse.Namespace) -> None:
    plan = harness.wait_command("run", timeout=PLAN_TIMEOUT)["plan"]

    import hivemind
    from hivemind.utils.timed_storage import get_dht_time

    start = time.perf_counter()
    dhts = [hivemind.DHT(start=True)]
    try:
        boot = [str(a) for a in dhts[0].get_visible_maddrs()]
        while len(dhts) < args.nodes:
            dhts.append(hivemind.DHT(initial_peers=boot, start=True))
        startup = time.perf_counter() - start
        time.sleep(args.settle)
        results = []
        for op in plan:
            dht = dhts[op["node"]]
            begin = time.perf_counter()
            if op["op"] == "store":
                ok = dht.store(op["key"], op["value"], get_dht_time() + op["ttl"]) is True
            else:
                found = dht.get(op["key"], latest=op["latest"])
                ok = found is not None and found.value == op["value"]
            results.append({"ok": ok, "ms": (time.perf_counter() - begin) * 1000})
    finally:
        for dht in dhts:
            try:
                dht.shutdown()
            except Exception as exc:  # report and go on: every daemon must be stopped
                print(f"shutdown of a hivemind DHT failed: {exc!r}", file=sys.stderr)
    harness.emit("result", startup_s=startup, results=results)


if __name__ == "__main__":
    main()
