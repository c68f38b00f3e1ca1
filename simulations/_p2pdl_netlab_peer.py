"""One peer of ``bench_allreduce.py --netlab`` (simulations/_allreduce_netlab.py), run
inside a netlab host's network namespace.

    python -m simulations._p2pdl_netlab_peer --rank I --ip A.B.C.D --bandwidths B0,..,B4 \
        --aux 4 --pairs R --numel M --codec fp16 --chunk-values C --timeout S

It opens a p2pdl node listening on its host's address ``--ip``, tells the
others its full address (the parent's address exchange, simulations/_harness.py),
connects to every peer of a higher rank
(each pair once) and builds the group of all peers in rank order; member i
declares ``bandwidth = B_i`` bytes/s and peers in ``--aux`` are auxiliary.
Three load plans of that group: ``lp``, the fractions a matchmaking leader
would send (``p2pdl.averaging.plan_fractions``), ``equal``, 1/n each (every
member accepts connections, the auxiliary one reduces too), and
``measured``: ``plan_fractions`` of the bandwidths the peers measured of
themselves in their rounds so far (``node.allreduce.capacity()``, gathered
through the parent's exchange just before the round; nothing typed in).

Pair p = 0 (untimed warm-up) .. R: the inputs of round p of
simulations/_allreduce_common.py (contributor ranks 0..K-1, weights 1 + rank;
the auxiliary peers pass weight 0 and zeros of the same shapes), averaged once
with each plan, ``lp`` first.  For each (pair, mode), these events, with the
parent's commands as barriers (simulations/_harness.py):

1. ``{"event": "ready", "pair": p, "mode": m, ...}``; then waits for ``go``.
2. ``{"event": "done", "t_start", "t_end", "completed", "error", "times",
   "bytes_sent", "bytes_received", "predicted_s", "excluded",
   "own_part_completed"}`` (``time.time()`` at the go and with the result in
   hand); then waits for ``next`` (every peer is
   done, so checking steals no CPU from a peer still averaging).
3. ``{"event": "result", "max_err", "tol", "ok"}`` (``ok`` is null for an
   auxiliary peer: it receives no result; ``done``'s ``own_part_completed``
   says whether it averaged its part).

The end of stdin or ``stop`` ends the peer; ``{"event": "fatal", ...}`` on
error.  Every wait ends at the run's deadline (``--timeout``).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import sys
import time

import torch
import trio
from libp2p.peer.id import ID

import p2pdl
from p2pdl import NodeConfig
from p2pdl.averaging import (
    Aggregator,
    AllReduceConfig,
    CodecPolicy,
    Group,
    GroupMemberInfo,
    plan_fractions,
)
from simulations import _harness as harness
from simulations._allreduce_common import (
    CODECS,
    make_inputs,
    max_error,
    tensor_shapes,
    tolerance,
    truth,
    weight,
)

MODES = ("lp", "equal", "measured")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ip", required=True, help="this host's address in the lab")
    parser.add_argument("--bandwidths", required=True,
                        help="comma-separated bytes/s of every peer, in rank order")
    parser.add_argument("--aux", default="", help="comma-separated ranks of auxiliary peers")
    parser.add_argument("--pairs", type=int, required=True,
                        help="timed (lp, equal) pairs, after one untimed warm-up pair")
    parser.add_argument("--numel", type=int, required=True)
    parser.add_argument("--codec", choices=CODECS, required=True)
    parser.add_argument("--chunk-values", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True,
                        help="seconds left for the whole run")
    args = parser.parse_args(argv)
    args.bandwidths = [float(b) for b in args.bandwidths.split(",")]
    args.aux = {int(a) for a in args.aux.split(",") if a}
    args.peers = len(args.bandwidths)
    args.contributors = args.peers - len(args.aux)
    if sorted(args.aux) != list(range(args.contributors, args.peers)):
        parser.error("auxiliary peers must have the highest ranks")
    args.deadline = time.time() + args.timeout
    return args


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def left(args: argparse.Namespace) -> float:
    return max(0.0, args.deadline - time.time())


async def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # 5 peers share 2 cores
    auxiliary = args.rank in args.aux
    # The weighted mean (verified): the rounds are checked against it.
    config = AllReduceConfig(aggregator=Aggregator("mean"), codecs=CodecPolicy(large=args.codec),
                             chunk_values=args.chunk_values,
                             averaging_timeout=min(120.0, max(5.0, args.deadline - time.time())))
    node_config = NodeConfig.build(listen=[f"/ip4/{args.ip}/tcp/0"])
    async with p2pdl.open_node(node_config) as node:
        addr = next(a for a in node.addrs if a.startswith(f"/ip4/{args.ip}/"))
        infos = await trio.to_thread.run_sync(
            harness.exchange, {"addr": addr, "peer_id": str(node.peer_id)}, left(args))
        with trio.fail_after(max(1.0, min(30.0, args.deadline - time.time()))):
            for rank, info in enumerate(infos):
                if rank > args.rank:  # each pair connects once
                    await node.connect(info["addr"])
        members = tuple(GroupMemberInfo(ID.from_base58(info["peer_id"]), auxiliary=i in args.aux,
                                        bandwidth=args.bandwidths[i])
                        for i, info in enumerate(infos))
        lp = plan_fractions(members)
        if lp is None:
            raise RuntimeError("plan_fractions gave no plan")
        plans = {"lp": tuple(lp), "equal": tuple(1.0 / args.peers for _ in members)}
        log(f"rank {args.rank} {node.peer_id} at {addr}; plans {plans}")
        shapes = tensor_shapes(args.numel)
        for pair in range(args.pairs + 1):
            if auxiliary:
                tensors = [torch.zeros(s) for s in shapes]
                expected, tol = None, math.inf
            else:
                expected, max_abs = truth(pair, args.contributors, args.numel)
                tol = tolerance(args.codec, args.contributors, max_abs)
                tensors = make_inputs(pair, args.rank, args.numel)
            for mode in MODES:
                if mode == "measured":
                    estimate = node.allreduce.capacity()
                    measured = await trio.to_thread.run_sync(
                        harness.exchange, {"up": estimate.up, "down": estimate.down,
                                           "bandwidth": estimate.bandwidth}, left(args))
                    declared = tuple(GroupMemberInfo(m.peer_id, auxiliary=m.auxiliary,
                                                     bandwidth=info["bandwidth"])
                                     for m, info in zip(members, measured, strict=True))
                    plans[mode] = tuple(plan_fractions(declared) or plans["equal"])
                group = Group(hashlib.sha256(f"netlab-allreduce/{mode}/{pair}".encode()).digest(),
                              "bench-netlab", pair, members, fractions=plans[mode])
                harness.emit("ready", pair=pair, mode=mode, rank=args.rank,
                             fractions=list(plans[mode]))
                await trio.to_thread.run_sync(harness.wait_command, "go", left(args))
                t_start = time.time()
                result = await node.allreduce.all_reduce(
                    group, tensors, weight=0.0 if auxiliary else weight(args.rank), config=config)
                t_end = time.time()
                error = None if result.completed else "; ".join(
                    f"part {p.reducer}: {p.error}" for p in result.parts if not p.completed)
                harness.emit("done", pair=pair, mode=mode, rank=args.rank,
                             t_start=t_start, t_end=t_end, completed=result.completed,
                             error=error, times=result.times, bytes_sent=result.bytes_sent,
                             bytes_received=result.bytes_received,
                             predicted_s=result.predicted_s, excluded=list(result.excluded),
                             # an auxiliary member receives no averages: its part is its job
                             own_part_completed=result.parts[args.rank].completed)
                await trio.to_thread.run_sync(harness.wait_command, "next", left(args))
                if expected is None:
                    harness.emit("result", pair=pair, mode=mode, rank=args.rank,
                                 max_err=None, tol=None, ok=None)
                else:
                    err = max_error(result.tensors, expected)
                    harness.emit("result", pair=pair, mode=mode, rank=args.rank,
                                 max_err=err if math.isfinite(err) else None, tol=tol,
                                 ok=bool(err <= tol and result.completed))
                log(f"pair {pair} {mode}: {t_end - t_start:.3f} s, times {result.times}")
        # Every peer is past the last barrier: leave together.


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args()
    with harness.reporting(rank=args.rank):
        trio.run(run, args)


if __name__ == "__main__":
    main()
