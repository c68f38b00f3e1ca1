"""torch.distributed gloo's side of bench_allreduce.py: one peer, one process.

    python -m simulations._gloo_allreduce --rank I --peers N --rounds R --codec none|fp16 \
        --numel M --timeout S

Rank 0 opens a TCPStore on 127.0.0.1 (port chosen by the OS) and tells the
others its port (the parent's address exchange); all join
``init_process_group("gloo", store=...)`` (gloo's own TCP pairs on ``lo``).
Each round (timed from the go to the result): the tensors are flattened
into one buffer pre-scaled by ``w_i / sum w`` (``torch.cat``; cast to
float16 for codec fp16), one ``all_reduce(SUM)`` on that flat buffer
(gloo's ring all-reduce; one big buffer is what it does best, and what
DDP's buckets give it), then the sum is cast back to float32 and split
into tensors of the original shapes.
"""

import datetime
import os
import time

import torch
import torch.distributed as dist

from simulations._allreduce_common import Worker, log


def allreduce(tensors: list, scale: float, codec: str) -> list:
    flat = torch.cat([t.reshape(-1) for t in tensors]).mul_(scale)
    if codec == "fp16":
        flat = flat.to(torch.float16)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat = flat.to(torch.float32)
    parts = flat.split([t.numel() for t in tensors])
    return [part.view(t.shape) for part, t in zip(parts, tensors, strict=True)]


def run(worker: Worker) -> None:
    timeout = datetime.timedelta(seconds=max(1.0, worker.left()))
    if worker.rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, worker.peers, True, timeout=timeout,
                              wait_for_workers=False)
    port = worker.exchange({"port": store.port} if worker.rank == 0 else {})[0]["port"]
    if worker.rank != 0:
        store = dist.TCPStore("127.0.0.1", port, worker.peers, False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=worker.rank, world_size=worker.peers,
                            timeout=timeout)
    log(f"gloo rank {worker.rank}/{worker.peers} joined (store port {port})")
    scale = worker.weight / worker.total_weight
    for r in range(worker.rounds + 1):
        tensors = worker.prepare(r)
        t_start = worker.ready(r)
        result, error = None, None
        try:
            result = allreduce(tensors, scale, worker.codec)
        except Exception as exc:  # report the round as failed; gloo rarely recovers
            error = f"{type(exc).__name__}: {exc}"
        t_end = time.time()
        worker.done(r, t_start, t_end, error)
        worker.check(r, result)
        if error is not None:
            raise RuntimeError(error)
    dist.destroy_process_group()


def main() -> None:
    worker = Worker()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with worker.reporting():
        run(worker)


if __name__ == "__main__":
    main()
