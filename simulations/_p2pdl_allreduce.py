"""p2pdl's side of bench_allreduce.py: one peer, one process.

    python -m simulations._p2pdl_allreduce --rank I --peers N --rounds R --codec none|fp16 \
        --numel M --timeout S

Each worker opens a node on loopback, tells the others its address (the
parent's address exchange), and connects to every other (as matchmaking
leaves a group: every member's address known).  Round r is an all-reduce
of the group of all N peers in rank order, with id SHA-256("bench-allreduce/<r>") and equal shares
(``node.allreduce.all_reduce(group, tensors, weight=w_i)``), timed from the
go to the averaged tensors in hand.  Codec ``none`` sends every tensor as
float32; ``fp16`` sends tensors of at least 65536 values in fp16 and the
smaller ones exact (the default ``CodecPolicy``).  ``--aggregator`` (default
``mean``) picks the reducers' rule, alone, with no verification; ``default``
is what ``AllReduceConfig()`` does: CenteredClip with ``tau="auto"`` and
verification (bench_robust.py times it; its results are then not the
weighted mean the check compares with).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time

import trio
from libp2p.peer.id import ID

import p2pdl
from p2pdl.averaging import Aggregator, AllReduceConfig, CodecPolicy, Group, GroupMemberInfo
from p2pdl.testing import loopback_config
from simulations._allreduce_common import Worker, log


async def run(worker: Worker) -> None:
    config = AllReduceConfig(codecs=CodecPolicy(large=worker.codec),
                             averaging_timeout=min(120.0, max(1.0, worker.left())))
    if worker.aggregator != "default":   # a rule alone, unverified
        config = dataclasses.replace(config, aggregator=Aggregator(worker.aggregator),
                                     verify=False)
    async with p2pdl.open_node(loopback_config()) as node:
        infos = await trio.to_thread.run_sync(
            worker.exchange, {"addr": f"{node.addrs[0]}/p2p/{node.peer_id}"})
        for rank, info in enumerate(infos):
            if rank > worker.rank:  # each pair connects once
                await node.connect(info["addr"])
        members = tuple(GroupMemberInfo(ID.from_base58(info["addr"].rsplit("/p2p/", 1)[1]))
                        for info in infos)
        log(f"p2pdl rank {worker.rank}/{worker.peers}: {node.peer_id}")
        for r in range(worker.rounds + 1):
            tensors = await trio.to_thread.run_sync(worker.prepare, r)
            group = Group(hashlib.sha256(f"bench-allreduce/{r}".encode()).digest(), "bench", r,
                          members)
            t_start = await trio.to_thread.run_sync(worker.ready, r)
            cpu = time.process_time()
            result = await node.allreduce.all_reduce(group, tensors, weight=worker.weight,
                                                     config=config)
            t_end = time.time()
            cpu = time.process_time() - cpu
            error = None if result.completed else "; ".join(
                f"part {p.reducer}: {p.error}" for p in result.parts if not p.completed)
            await trio.to_thread.run_sync(worker.done, r, t_start, t_end, error, None, cpu)
            await trio.to_thread.run_sync(worker.check, r, result.tensors)
            log(f"round {r}: {result.times}")
        # Every peer is done with the last round (done's barrier): leave together.


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    worker = Worker()
    with worker.reporting():
        trio.run(run, worker)


if __name__ == "__main__":
    main()
