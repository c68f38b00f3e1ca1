"""When does the swarm know the global batch is full?  Gossip vs DHT polling, in one run.

    python simulations/bench_progress.py [--peers 16] [--processes 4] [--epochs 6]
                                         [--target 8192] [--seed 0]

Both modes run the same simulated trainers (``p2pdl.testing.simulate_progress``:
16 peers of unequal speed, a batch of 32 samples per step, step times with a
log-normal jitter and occasional pauses) on real p2pdl nodes on loopback, in
``--processes`` processes, one mode after the other with fresh nodes:

* ``gossip`` -- the progress protocol (``node.progress.track``);
* ``poll`` -- the reference's approach: reports stored in the DHT, the whole
  key fetched at hivemind 1.1.12's refresh rule (0.5 to 10 s).

Both publish on the same policy and decide ``ready_to_step`` with the same
aggregator; only the transport differs.  For each epoch the true fill time
is the moment the sum of all peers' samples (from their step logs, one wall
clock) reaches the target; a peer's delay is the time from then until it saw
``ready_to_step`` (negative when it was ready before the batch was truly
full; ``*_ready_p50_s`` and ``*_ready_max_s`` are over the absolute delays).
Bytes are p2pdl frame bytes sent by the nodes on the progress and DHT
protocols during the run (``p2pdl.wire.traffic``), per peer per minute, in
all and per protocol (the gossip mode's DHT bytes are its snapshots and the
DHT's own upkeep).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2pdl.dht import DHT_PROTOCOL_ID  # noqa: E402
from p2pdl.progress import PROGRESS_PROTOCOL_ID  # noqa: E402
from p2pdl.testing import open_swarm_agents  # noqa: E402


def fill_times(steps: list[list[Any]], target: int) -> dict[int, float]:
    """Per epoch, when the sum over peers of their latest counts first reached ``target``."""
    by_epoch: dict[int, list[tuple[float, int, int]]] = {}
    for peer, epoch, samples, t in steps:
        by_epoch.setdefault(epoch, []).append((t, peer, samples))
    fills = {}
    for epoch, events in by_epoch.items():
        events.sort()
        latest: dict[int, int] = {}
        total = 0
        for t, peer, samples in events:
            total += samples - latest.get(peer, 0)
            latest[peer] = samples
            if total >= target:
                fills[epoch] = t
                break
    return fills


def summarize(logs: list[dict[str, Any]], target: int, peers: int) -> dict[str, Any]:
    steps = [s for log in logs for s in log["steps"]]
    ready = [r for log in logs for r in log["ready"]]
    fills = fill_times(steps, target)
    delays = [t - fills[epoch] for _, epoch, t in ready if epoch in fills]
    spreads = []
    for epoch in fills:
        times = [t for _, e, t in ready if e == epoch]
        if len(times) == peers:
            spreads.append(max(times) - min(times))
    absolute = sorted(abs(d) for d in delays)
    seconds = max(log["seconds"] for log in logs)
    sent = sum(log["bytes_sent"] for log in logs)
    by_protocol: dict[str, int] = {}
    for log in logs:
        for protocol, n in log["bytes_by_protocol"].items():
            by_protocol[protocol] = by_protocol.get(protocol, 0) + n
    per_min = peers * (seconds / 60)
    epochs = sorted({e for _, e, _ in ready})
    return {
        "ready_p50_s": round(statistics.median(absolute), 4) if absolute else None,
        "ready_max_s": round(max(absolute), 4) if absolute else None,
        "ready_signed_p50_s": round(statistics.median(delays), 4) if delays else None,
        "early_fraction": round(sum(d < 0 for d in delays) / len(delays), 3) if delays else None,
        "spread_p50_s": round(statistics.median(spreads), 4) if spreads else None,
        "bytes_per_peer_min": round(sent / per_min),
        "progress_bytes_per_peer_min": round(by_protocol.get(PROGRESS_PROTOCOL_ID, 0) / per_min),
        "dht_bytes_per_peer_min": round(by_protocol.get(DHT_PROTOCOL_ID, 0) / per_min),
        "epochs": len(epochs), "epochs_unfilled": len([e for e in epochs if e not in fills]),
        "ready_events": len(delays), "seconds": round(seconds, 1),
    }


async def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    per = args.peers // args.processes
    async with open_swarm_agents(args.processes, per, timeout=180) as agents:
        for agent in agents:
            await agent.command("wait_dht", contacts=min(8, args.peers - 1), timeout=120)
        await trio.sleep(args.settle)
        start_at = time.time() + 2.0
        logs: list[dict[str, Any]] = [{}] * len(agents)

        async def run(i: int) -> None:
            logs[i] = await agents[i].command(
                "progress", timeout=args.max_seconds + 60,
                args={"mode": mode, "run_id": f"bench-{mode}-{args.seed}", "target": args.target,
                      "epochs": args.epochs, "seed": args.seed, "first_index": i * per,
                      "start_at": start_at, "max_seconds": args.max_seconds})

        async with trio.open_nursery() as nursery:
            for i in range(len(agents)):
                nursery.start_soon(run, i)
    return summarize(logs, args.target, per * len(logs))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"peers": args.peers, "processes": args.processes,
                           "target_batch_size": args.target, "epochs": args.epochs,
                           "seed": args.seed}
    results = {}
    for mode in ("gossip", "poll"):
        results[mode] = await run_mode(mode, args)
        for key, value in results[mode].items():
            out[f"{mode}_{key}"] = value
    g, p = results["gossip"], results["poll"]
    if g["ready_p50_s"] and p["ready_p50_s"]:
        out["poll_vs_gossip_ready_p50"] = round(p["ready_p50_s"] / g["ready_p50_s"], 2)
        out["poll_vs_gossip_ready_max"] = round(p["ready_max_s"] / g["ready_max_s"], 2)
    out["gossip_vs_poll_bytes"] = round(g["bytes_per_peer_min"] / p["bytes_per_peer_min"], 3)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--target", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.peers % args.processes:
        parser.error("--peers must be a multiple of --processes")
    return args


if __name__ == "__main__":
    print(json.dumps(trio.run(main, parse_args())))
