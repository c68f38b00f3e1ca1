"""p2pdl.testing: the helpers the tests and simulations share."""

from __future__ import annotations

import time

import trio

from p2pdl.testing import open_memory_nodes, open_node_processes, open_nodes, wait_for_dht


async def test_node_processes_form_a_swarm_that_in_process_nodes_can_join():
    async with open_node_processes(3) as procs, open_nodes(1) as (local,):
        assert len({p.peer_id for p in procs}) == 3
        for proc in procs:
            await local.connect(proc.addrs[0])
            assert await local.ping(proc.peer_id) < 5
        with trio.fail_after(20):  # the first process sees both others and us
            while not any("3 connected peer" in line for line in procs[0].lines):
                await trio.sleep(0.1)
        procs[1].kill()
        await procs[1].process.wait()
        assert procs[1].process.returncode != 0


async def test_memory_nodes_run_on_trio_s_real_clock_too():
    # Without a MockClock the memory swarm's clock is the wall clock's pace.
    async with open_memory_nodes(3) as nodes:
        await wait_for_dht(nodes)
        assert abs(nodes[0].dht.now() - time.time()) < 5
        assert await nodes[0].dht.store("real-time", 1, nodes[0].dht.now() + 30)
        assert (await nodes[2].dht.get("real-time")).value == 1
