"""One peer of bench_membership.py's round-overhead part: one process, one node.

    python -m simulations._membership_peer --rank I --peers N --rounds R --numel M \
        --identity FILE --authority ID --certificate FILE --timeout S

The node is a member of two runs at once: ``bench-open`` (no policy: open)
and ``bench-closed`` (a certificate run under ``--authority``, this peer's
``--certificate``).  Round r averages ``--numel`` float32 values (13 uneven
tensors, as bench_allreduce.py's) among all N peers in a fixed group of the
run :func:`run_of` (r) (equal weights, ``node.allreduce.all_reduce``), so the
two runs alternate (open, closed, closed, open, open, ...) over the same
nodes, connections and processes; rounds 0 and 1 are the warm-ups (the
closed run's certificates are exchanged then).
The protocol with the parent is simulations/_harness.py's: ``address``
exchange, then per round ``ready`` -> ``go`` -> ``done`` (``t_start``,
``t_end``: time.time() at the go and with the averaged tensors in hand,
``error``) -> ``next``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time

import torch
import trio
from libp2p.peer.id import ID

import p2pdl
from p2pdl.averaging import AllReduceConfig, Group, GroupMemberInfo
from p2pdl.testing import loopback_config
from simulations import _harness as harness
from simulations._allreduce_common import make_inputs

#: The two runs the rounds alternate between: open first, then the certificate run.
RUNS = ("bench-open", "bench-closed")


def run_of(round_: int) -> str:
    """The run of round ``round_``: open, certificate, then pairs in turn
    (certificate, open), (open, certificate)... so that neither always goes first."""
    return RUNS[(round_ + round_ // 2) % 2]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for name in ("--rank", "--peers", "--rounds", "--numel"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--identity", "--authority", "--certificate"):
        parser.add_argument(name, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    args.deadline = time.time() + args.timeout
    return args


async def run(args: argparse.Namespace) -> None:
    left = lambda: max(0.0, args.deadline - time.time())  # noqa: E731
    config = loopback_config(p2pdl.NodeConfig.build(identity_path=args.identity))
    policy = p2pdl.CertificateRun(RUNS[1], args.authority, args.certificate)
    allreduce = AllReduceConfig(averaging_timeout=min(120.0, max(1.0, left())))
    async with p2pdl.open_node(config, runs=[policy]) as node:
        mine = {"addr": f"{node.addrs[0]}/p2p/{node.peer_id}"}   # read on the trio thread
        infos = await trio.to_thread.run_sync(lambda: harness.exchange(mine, timeout=left()))
        for rank, info in enumerate(infos):
            if rank > args.rank:  # each pair connects once
                await node.connect(info["addr"])
        members = tuple(GroupMemberInfo(ID.from_base58(info["addr"].rsplit("/p2p/", 1)[1]))
                        for info in infos)
        for r in range(args.rounds + 2):
            run_id = run_of(r)
            tensors = make_inputs(r, args.rank, args.numel)
            group = Group(hashlib.sha256(f"bench-membership/{r}".encode()).digest(), run_id,
                          r, members)
            harness.emit("ready", round=r, rank=args.rank)
            await trio.to_thread.run_sync(lambda: harness.wait_command("go", timeout=left()))
            t_start = time.time()
            result = await node.allreduce.all_reduce(group, tensors, weight=1.0,
                                                     config=allreduce)
            t_end = time.time()
            error = None if result.completed else "; ".join(
                f"part {p.reducer}: {p.error}" for p in result.parts if not p.completed)
            if error is None and not all(bool(torch.isfinite(t).all()) for t in result.tensors):
                error = "a value is not finite"
            harness.emit("done", round=r, rank=args.rank, run=run_id, t_start=t_start,
                         t_end=t_end, error=error)
            await trio.to_thread.run_sync(lambda: harness.wait_command("next", timeout=left()))
        stats = node.membership.statistics()
        harness.emit("membership", rank=args.rank,
                     handshakes_sent=getattr(stats, "handshakes_sent", None),
                     handshakes_answered=getattr(stats, "handshakes_answered", None))
        await trio.to_thread.run_sync(lambda: harness.wait_command("stop", timeout=left()))


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(1)
    args = parse()
    with harness.reporting(rank=args.rank):
        trio.run(run, args)


if __name__ == "__main__":
    main()
