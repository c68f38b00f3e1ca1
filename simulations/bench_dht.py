"""DHT latency and success: p2pdl and hivemind 1.1.12 side by side, in one run, on loopback.

    python simulations/bench_dht.py [--nodes 32] [--records 200] [--no-hivemind]

Both systems get the same plan: ``--records`` keys, each stored once from a
random node, then read once from a random node with ``latest=False`` (the
default get: any unexpired value, the node's own copy if it holds one) and
once with ``latest=True`` (ask the nodes nearest to the key), one operation
at a time.  Latency is measured where the application calls the DHT (p2pdl:
in the node's trio task; hivemind: around ``hivemind.DHT.store`` / ``get``).
A store succeeds when it reports success, a get when it returns the stored
value.

p2pdl runs ``--processes`` processes of nodes (default 4 × 8 = 32);
hivemind runs each peer as it does for its users, a process plus a Go
daemon.  hivemind lives in its own virtual environment, built on first use
(simulations/_baselines.py); if it cannot be installed its keys are null and
``note`` says why.  Prints one JSON object; ``*_vs_hivemind`` keys are ratios
p2pdl / hivemind (below 1: p2pdl faster).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2pdl.testing import open_swarm_agents  # noqa: E402
from simulations._baselines import HIVEMIND_VERSION, hivemind_python  # noqa: E402
from simulations._harness import RunFailed, Supervisor  # noqa: E402

TTL = 900.0  # seconds: nothing expires during the run
HIVEMIND_TIMEOUT = 1200.0  # seconds for hivemind's whole part
HIVEMIND_EXIT_GRACE = 30.0  # seconds for its process to exit once it sent its result


def make_plan(nodes: int, records: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    values = [{"i": i, "blob": rng.randbytes(48).hex()} for i in range(records)]
    plan = [{"op": "store", "node": rng.randrange(nodes), "key": f"bench/{seed}/{i}",
             "value": values[i], "ttl": TTL} for i in range(records)]
    for latest in (False, True):
        plan += [{"op": "get", "node": rng.randrange(nodes), "key": f"bench/{seed}/{i}",
                  "value": values[i], "latest": latest} for i in range(records)]
    return plan


async def run_p2pdl(plan: list[dict[str, Any]], nodes: int, processes: int,
                    settle: float) -> dict[str, Any]:
    per = nodes // processes
    start = time.perf_counter()
    async with open_swarm_agents(processes, per, timeout=180) as agents:
        for agent in agents:
            await agent.command("wait_dht", contacts=min(8, nodes - 1), timeout=120)
        startup = time.perf_counter() - start
        await trio.sleep(settle)
        results = []
        for op in plan:
            agent, node = agents[op["node"] // per], op["node"] % per
            if op["op"] == "store":
                reply = await agent.command("store", node=node, key=op["key"],
                                            value=op["value"], ttl=op["ttl"])
                results.append({"ok": reply["ok"], "ms": reply["ms"]})
            else:
                reply = await agent.command("get", node=node, key=op["key"],
                                            latest=op["latest"])
                results.append({"ok": reply["found"] and reply["value"] == op["value"],
                                "ms": reply["ms"], "local": reply["local"]})
        stats = [n["dht"] for a in agents for n in await a.command("status")]
    return {"startup_s": startup, "results": results,
            "mean_table_size": sum(s["routing_table"] for s in stats) / len(stats)}


def run_hivemind(plan: list[dict[str, Any]], nodes: int,
                 settle: float) -> tuple[dict[str, Any] | None, str]:
    python, why = hivemind_python()
    if python is None:
        return None, why
    log_dir = Path(tempfile.gettempdir()) / \
        f"p2pdl-bench-dht-hivemind-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        # Its own session, signalled whole: every DHT process and Go daemon goes at the end.
        with Supervisor(name="hivemind", log_dir=log_dir, timeout=HIVEMIND_TIMEOUT,
                        exit_grace=HIVEMIND_EXIT_GRACE) as child:
            child.start([str(python), "-m", "simulations._hivemind_dht", "--nodes", str(nodes),
                         "--settle", str(settle)])
            child.send("run", plan=plan)
            result = child.wait_all("result")[0]
    except RunFailed as exc:
        return None, f"hivemind's run failed: {exc} (logs: {log_dir})"
    return {"startup_s": result["startup_s"], "results": result["results"]}, ""


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(plan: list[dict[str, Any]], run: dict[str, Any], prefix: str) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {"store": [], "get": [], "get_latest": []}
    for op, result in zip(plan, run["results"], strict=True):
        name = op["op"] if not op.get("latest") else "get_latest"
        groups[name].append(result)
    out: dict[str, Any] = {}
    for name, results in groups.items():
        ms = [r["ms"] for r in results]
        out[f"{prefix}{name}_p50_ms"] = round(percentile(ms, 0.5), 2)
        out[f"{prefix}{name}_p99_ms"] = round(percentile(ms, 0.99), 2)
    everything = run["results"]
    out[f"{prefix}success_rate"] = round(sum(r["ok"] for r in everything) / len(everything), 4)
    out[f"{prefix}startup_s"] = round(run["startup_s"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32, help="DHT nodes (default 32)")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes the p2pdl nodes run in (default 4)")
    parser.add_argument("--records", type=int, default=200,
                        help="keys stored and read back (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle", type=float, default=15.0,
                        help="seconds both systems idle after start-up before the first "
                             "operation (default 15: connections and tables settle)")
    parser.add_argument("--no-hivemind", action="store_true", help="skip hivemind")
    args = parser.parse_args()
    if args.nodes < 2 or args.processes < 1 or args.nodes % args.processes:
        parser.error("--nodes must be at least 2 and a multiple of --processes")
    if args.records < 1:
        parser.error("--records must be at least 1")

    plan = make_plan(args.nodes, args.records, args.seed)
    mine = trio.run(run_p2pdl, plan, args.nodes, args.processes, args.settle)
    report: dict[str, Any] = {"nodes": args.nodes, "records": args.records,
                              "p2pdl_processes": args.processes, "settle_s": args.settle}
    report.update(summarise(plan, mine, ""))
    defaults = [r for op, r in zip(plan, mine["results"], strict=True)
                if op["op"] == "get" and not op["latest"]]
    report["get_local_fraction"] = round(sum(r["local"] for r in defaults) / len(defaults), 3)
    remote = [r["ms"] for r in defaults if not r["local"]]
    report["get_remote_p50_ms"] = round(percentile(remote, 0.5), 2) if remote else None
    report["mean_table_size"] = round(mine["mean_table_size"], 1)

    if args.no_hivemind:
        theirs, why = None, "hivemind skipped (--no-hivemind)"
    else:
        theirs, why = run_hivemind(plan, args.nodes, args.settle)
    keys = summarise(plan, mine, "hivemind_")  # the key names, for nulls
    if theirs is None:
        report.update({k: None for k in keys})
        report["note"] = why
    else:
        report.update(summarise(plan, theirs, "hivemind_"))
        for name in ("store_p50_ms", "get_p50_ms", "get_latest_p50_ms"):
            report[f"{name[:-3]}_vs_hivemind"] = round(
                report[name] / max(report[f"hivemind_{name}"], 1e-3), 3)
        report["note"] = (f"hivemind {HIVEMIND_VERSION}, defaults (num_replicas 5, its own "
                          f"caching); p2pdl defaults (replication 20): a default get is "
                          f"answered locally when the node holds a replica "
                          f"(get_local_fraction; get_remote_p50_ms: the default gets that "
                          f"asked the network); get_latest always asks the network")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
