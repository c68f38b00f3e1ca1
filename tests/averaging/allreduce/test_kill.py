"""A member SIGKILLed during scatter and during gather (it runs in its own process):
the others finish within the timeouts with identical results."""

from __future__ import annotations

import hashlib
import json
import pathlib
import signal
import subprocess
import sys

import pytest
import torch
import trio

from p2pdl.averaging import (
    Aggregator,
    AllReduceConfig,
    CodecPolicy,
    Group,
    GroupMemberInfo,
    cap_shares,
)
from p2pdl.testing import open_nodes

from .ar_peer import peer_inputs

#: These tests check the weighted mean (the default rule is CenteredClip).
MEAN = Aggregator()

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

PEER_SCRIPT = pathlib.Path(__file__).with_name("ar_peer.py")


async def read_json_line(stream, buffer: bytearray) -> dict:
    while b"\n" not in buffer:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise EOFError("the child process closed its output")
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)
TIMEOUTS = {"sender_timeout": 2.0, "reducer_timeout": 4.0, "averaging_timeout": 30.0,
            "chunk_values": 4096}


@pytest.mark.parametrize("mode", ["scatter", "gather"])
async def test_a_member_killed_mid_round_leaves_the_others_identical_results(mode):
    seed, weights = 7, [1.0, 2.0, 3.0, 4.0]
    config = AllReduceConfig(aggregator=MEAN, codecs=CodecPolicy(large="none"), **TIMEOUTS)
    async with open_nodes(3) as nodes:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(PEER_SCRIPT), mode], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        try:
            buffer = bytearray()
            with trio.fail_after(30):
                hello = await read_json_line(process.stdout, buffer)
            for i, a in enumerate(nodes):
                await a.connect(hello["addr"])
                for b in nodes[i + 1:]:
                    await a.connect(f"{b.addrs[0]}/p2p/{b.peer_id}")
            ids = [str(n.peer_id) for n in nodes] + [hello["peer_id"]]
            ids.sort()  # the child's index depends on its id: any position is fine
            killed = ids.index(hello["peer_id"])
            tag = f"kill-{mode}"
            request = {"members": ids, "addrs": [f"{n.addrs[0]}/p2p/{n.peer_id}" for n in nodes],
                       "tag": tag, "seed": seed, "weight": weights[killed],
                       "config": TIMEOUTS}
            await process.stdin.send_all(json.dumps(request).encode() + b"\n")
            by_id = {str(n.peer_id): n for n in nodes}
            members = tuple(GroupMemberInfo(by_id[p].peer_id if p in by_id else
                                            _child_id(p)) for p in ids)
            group = Group(hashlib.sha256(tag.encode()).digest(), "run", 1, members)
            xs = [peer_inputs(seed, i) for i in range(4)]
            results = {}
            start = trio.current_time()

            async def survivor(i):
                node = by_id[ids[i]]
                results[i] = await node.allreduce.all_reduce(group, xs[i], weight=weights[i],
                                                             config=config)

            async def kill_on_event():
                with trio.fail_after(30):
                    while (await read_json_line(process.stdout, buffer)).get("event") != mode:
                        pass
                process.send_signal(signal.SIGKILL)
                await process.wait()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_on_event)
                for i in range(4):
                    if i != killed:
                        nursery.start_soon(survivor, i)
            elapsed = trio.current_time() - start
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    assert elapsed < config.sender_timeout + config.reducer_timeout + 10
    survivors = sorted(results)
    flats = {i: torch.cat([t.reshape(-1) for t in results[i].tensors]) for i in survivors}
    inputs = [torch.cat([t.reshape(-1) for t in x]) for x in xs]
    for i in survivors:
        parts = results[i].parts
        # the killed member's part never completes: every survivor keeps its own values
        lost = parts[killed]
        assert not lost.completed and lost.error
        assert torch.equal(flats[i][lost.start:lost.end], inputs[i][lost.start:lost.end])
        for r, part in enumerate(parts):
            if r == killed:
                continue
            assert part.completed, part.error
            # identical among survivors...
            for j in survivors:
                assert torch.equal(flats[i][part.start:part.end], flats[j][part.start:part.end])
            # ...and the weighted mean over the contributors the reducer reported,
            # with the share cap over exactly those (a chunk the killed member
            # did not deliver has three contributors: 4 of 1, 2, 4 counts as 3)
            for seg in part.contributions:
                assert survivors == [c for c in seg.contributors if c != killed]
                counted = cap_shares([weights[c] for c in seg.contributors],
                                     config.max_weight_share)
                assert seg.weight == pytest.approx(sum(counted))
                expected = sum(w * inputs[c][seg.start:seg.end] for c, w in
                               zip(seg.contributors, counted, strict=True)) / sum(counted)
                assert torch.allclose(flats[i][seg.start:seg.end], expected, atol=1e-5)
    if mode == "scatter":
        # the killed member's first chunks counted where they arrived, nothing after
        counted = {c for i in survivors for p in results[i].parts
                   for seg in p.contributions for c in seg.contributors}
        assert killed in counted
        assert any(killed not in seg.contributors for p in results[survivors[0]].parts
                   for seg in p.contributions)
    else:
        # it had sent all its values: it counts everywhere but in its own part
        for part in results[survivors[0]].parts:
            for seg in part.contributions:
                assert killed in seg.contributors


def _child_id(text: str):
    from libp2p.peer.id import ID

    return ID.from_base58(text)
