"""hivemind 1.1.12's side of bench_allreduce.py: one peer, one process (plus
its Go p2pd daemon, a child of this process).  Runs with hivemind's own
interpreter (simulations/_baselines.py) from the repository root:

    <hivemind venv>/bin/python -m simulations._hivemind_allreduce --rank I --peers N \
        --rounds R --codec none|fp16 --numel M --timeout S

What is measured is hivemind's all-reduce itself, not its matchmaking: each
round builds ``hivemind.averaging.allreduce.AllReduceRunner`` directly (as
hivemind's tests/test_allreduce.py does) for the fixed group of all N peers
-- a shared ``group_id``, ``ordered_peer_ids`` in rank order, equal
``peer_fractions`` (what ``load_balance_peers`` gives peers of equal
bandwidth), ``weight = w_i``, ``compression = NoCompression()`` or
``Float16Compression()`` and DecentralizedAverager's defaults otherwise
(``part_size_bytes = 2**19``, no sender/reducer timeouts).  Incoming
``rpc_aggregate_part`` streams reach the round's runner through a servicer
that dispatches on ``group_id`` exactly like ``DecentralizedAverager``.  The
runner is built (tensors split into parts) before the go; timed is what
``DecentralizedAverager._run_allreduce_inplace_`` does once the group is
formed: iterate the runner and ``tensor.add_(delta)`` until every tensor has
its average.

Peers start their P2P daemons (hivemind's defaults, TCP on 127.0.0.1),
tell each other peer id and multiaddrs (the parent's address exchange) and
connect to every other peer before the warm-up round.
"""

import asyncio
import concurrent.futures
import hashlib
import time
import traceback

# typing's AsyncIterator, not collections.abc's: hivemind's ServicerBase recognises streaming
# RPCs by the hint's ``_name``, which only typing's aliases have
from typing import AsyncIterator  # noqa: UP035

from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.compression import Float16Compression, NoCompression
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import achain, anext, as_aiter, azip
from hivemind.utils.multiaddr import Multiaddr

from simulations._allreduce_common import Worker, log

PREFIX = "bench_allreduce"


class Dispatcher(ServicerBase):
    """Routes a groupmate's parts to this round's runner (by group_id), as
    DecentralizedAverager.rpc_aggregate_part does."""

    def __init__(self) -> None:
        self.runners: dict[bytes, AllReduceRunner] = {}

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        request = await anext(stream)
        runner = self.runners.get(request.group_id)
        if runner is None:
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        async for message in runner.rpc_aggregate_part(achain(as_aiter(request), stream), context):
            yield message


async def average(runner: AllReduceRunner, tensors: list) -> None:
    """What DecentralizedAverager._run_allreduce_inplace_ does with a runner (alpha 1)."""
    async for tensor, delta in azip(as_aiter(*tensors), runner):
        tensor.add_(delta)


async def run(worker: Worker) -> None:
    blocking = concurrent.futures.ThreadPoolExecutor(1)  # the barrier's stdin reads
    loop = asyncio.get_running_loop()
    compression = Float16Compression() if worker.codec == "fp16" else NoCompression()
    p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        dispatcher = Dispatcher()
        await dispatcher.add_p2p_handlers(p2p, namespace=PREFIX)
        info = {"peer_id": p2p.peer_id.to_base58(),
                "maddrs": [str(m) for m in await p2p.get_visible_maddrs()]}
        infos = await loop.run_in_executor(blocking, worker.exchange, info)
        peer_ids = [PeerID.from_base58(info["peer_id"]) for info in infos]
        for rank, (peer_id, info) in enumerate(zip(peer_ids, infos, strict=True)):
            if rank != worker.rank:
                await asyncio.wait_for(
                    p2p._client.connect(peer_id, [Multiaddr(m.split("/p2p/")[0])
                                               for m in info["maddrs"]]),
                    timeout=max(1.0, worker.left()))
        log(f"hivemind rank {worker.rank}/{worker.peers}: {p2p.peer_id} connected to all")
        fractions = tuple(1.0 for _ in range(worker.peers))
        run_key = "/".join(info["peer_id"] for info in infos)  # this run's peers: unique

        for r in range(worker.rounds + 1):
            tensors = await loop.run_in_executor(blocking, worker.prepare, r)
            group_id = hashlib.sha1(f"{run_key}/{r}".encode()).digest()
            runner = AllReduceRunner(
                p2p=p2p, servicer_type=Dispatcher, prefix=PREFIX, group_id=group_id,
                tensors=tensors, weight=worker.weight, ordered_peer_ids=peer_ids,
                peer_fractions=fractions, compression=compression)
            dispatcher.runners[group_id] = runner
            t_start = await loop.run_in_executor(blocking, worker.ready, r)
            error = None
            try:
                await asyncio.wait_for(average(runner, tensors), timeout=max(1.0, worker.left()))
            except Exception as exc:  # report the round as failed, go on with the next
                error = f"{type(exc).__name__}: {exc}"
                log(traceback.format_exc())
            t_end = time.time()
            container = runner.tensor_part_container
            note = None
            if container.failed_size:  # hivemind's runner says nothing but a log line
                note = (f"{container.failed_size / container.total_size:.1%} of the values "
                        f"kept local (a reducer failed: see the log)")
            await loop.run_in_executor(blocking, worker.done, r, t_start, t_end, error, note)
            dispatcher.runners.pop(group_id, None)
            worker.check(r, tensors if error is None else None)
    finally:
        await p2p.shutdown()
        blocking.shutdown(wait=False)


def main() -> None:
    worker = Worker()
    with worker.reporting():
        asyncio.run(run(worker))


if __name__ == "__main__":
    main()
