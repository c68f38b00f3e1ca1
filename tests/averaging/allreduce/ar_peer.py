"""An all-reduce member in its own process, for tests that kill it (SIGKILL).

    python tests/averaging/allreduce/ar_peer.py MODE

Prints ``{"peer_id": ..., "addr": ...}``, then reads one JSON line:
``{"members": [peer ids in group order], "addrs": [addresses to connect to],
"tag": group tag, "seed": int, "weight": float, "config": {AllReduceConfig fields}}``
and joins the all-reduce, but stops half-way -- it prints ``{"event": MODE}``
and waits to be killed:

* ``scatter``: after sending the first chunk of its values to each reducer
  (its own reducer sends no average);
* ``gather``: once the averages of every other part are in (so every reducer
  has all its values) and its own part's first averaged chunk went to every
  sender.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import trio
from libp2p.peer.id import ID

import p2pdl
from p2pdl.averaging import Aggregator, AllReduceConfig, CodecPolicy, Group, GroupMemberInfo
from p2pdl.averaging.allreduce import _service as service
from p2pdl.testing import loopback_config

#: These tests check the weighted mean (the default rule is CenteredClip).
MEAN = Aggregator()

SHAPES = [(30000,), (123, 45), (7,)]


def peer_inputs(seed: int, index: int) -> list[torch.Tensor]:
    """Member ``index``'s tensors (the test computes everyone's from the same seed)."""
    gen = torch.Generator().manual_seed(seed * 1000 + index)
    return [torch.randn(*shape, generator=gen) for shape in SHAPES]


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def stop_scatter(self, stream, session, r, sent, pending) -> None:  # noqa: ANN001
    chunk = session.layout.chunks[r][0]
    await stream.send_tensor_chunk(chunk.header(),
                                   chunk.codec.encode(session.flat[chunk.start:chunk.end]))
    sent[0] += 1
    if sent[0] == pending:
        say(event="scatter")
    await trio.sleep_forever()


async def hold_results(self, stream, session, sender) -> None:  # noqa: ANN001
    await trio.sleep_forever()


async def stop_gather(self, stream, session, sender) -> None:  # noqa: ANN001
    reducer = session.reducer
    while reducer.final < 1:
        await session.wait_progress()
    await stream.send_tensor_chunk(reducer.chunks[0].header(), reducer.payloads[0])
    stop_gather.sent += 1
    while "gather" not in session.times:  # every other part's averages are in, so
        await trio.sleep(0.01)            # every reducer has all of this peer's values
    if stop_gather.sent == len(reducer.receivers()):
        say(event="gather")
    await trio.sleep_forever()


stop_gather.sent = 0


async def main(mode: str) -> None:
    if mode == "scatter":
        service.AllReduceService._send_values = stop_scatter
        # Killed before its own part is averaged, however fast the others' values
        # arrive: its reducer sends no average (a race the test must not run).
        service.AllReduceService._send_results = hold_results
    else:
        service.AllReduceService._send_results = stop_gather
    async with p2pdl.open_node(loopback_config()) as node:
        say(peer_id=str(node.peer_id), addr=f"{node.addrs[0]}/p2p/{node.peer_id}")
        request = json.loads(await trio.to_thread.run_sync(sys.stdin.readline))
        for addr in request["addrs"]:
            await node.connect(addr)
        members = tuple(GroupMemberInfo(ID.from_base58(p)) for p in request["members"])
        group = Group(hashlib.sha256(request["tag"].encode()).digest(), "run", 1, members)
        me = group.index_of(node.peer_id)
        config = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"),
                                 **request["config"])
        tensors = peer_inputs(request["seed"], me)
        await node.allreduce.all_reduce(group, tensors, weight=request["weight"], config=config)
        say(event="finished")  # not expected: the test kills this process first
        await trio.sleep_forever()


if __name__ == "__main__":
    torch.set_num_threads(1)
    trio.run(main, sys.argv[1])
