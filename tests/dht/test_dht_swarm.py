"""32 real DHT nodes on loopback, in 4 processes of 8, plus an attacker in this process.

One scenario, in order: every store and get succeeds; 8 writers' subkeys are
merged under one key at every replica; a forged owned subkey is rejected by
all 32 nodes; expired records are gone everywhere; malformed and oversized
messages leave the nodes serving; a whole process (25% of the nodes) is
SIGKILLed and every record stored before is still found by the survivors.
"""

from __future__ import annotations

import random
import time

import msgpack
import pytest
import trio

import p2pdl
from p2pdl.dht import DHT_PROTOCOL, distance, key_of, owned_subkey
from p2pdl.dht._messages import Store, WireItem
from p2pdl.dht._validation import sign
from p2pdl.net import parse_peer_id
from p2pdl.testing import loopback_config, open_swarm_agents
from p2pdl.wire import FrameKind
from p2pdl.wire._frames import frame_header

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PROCESSES, NODES = 4, 8
RECORDS = 64


async def test_32_nodes_store_get_merge_reject_expire_and_survive_a_quarter_dying():
    rng = random.Random(7)
    async with open_swarm_agents(PROCESSES, NODES) as agents:
        everyone = [(a, i) for a in agents for i in range(NODES)]
        for agent in agents:
            await agent.command("wait_dht", contacts=8, timeout=120)

        # -- every store and every get succeeds --------------------------------
        for n in range(RECORDS):
            agent, node = rng.choice(everyone)
            result = await agent.command("store", node=node, key=f"record-{n}", value=n,
                                         ttl=600)
            assert result["ok"], f"store of record-{n} failed"
        misses = []
        for n in range(RECORDS):
            agent, node = rng.choice(everyone)
            result = await agent.command("get", node=node, key=f"record-{n}",
                                         latest=n % 2 == 0)
            if not (result["found"] and result["value"] == n):
                misses.append((n, result))
        assert misses == []

        # -- 8 writers' subkeys, written at once, merged at every replica --------
        writers = [(agents[p], n) for p in range(PROCESSES) for n in (1, 5)]
        writer_ids = [agent.ready["nodes"][n]["peer_id"] for agent, n in writers]
        async with trio.open_nursery() as nursery:
            for p, agent in enumerate(agents):
                ops = [{"op": "store", "node": n, "key": "run/progress", "subkey": "@own",
                        "value": {"writer": f"{p}.{n}"}, "ttl": 600} for n in (1, 5)]

                async def write(agent=agent, ops=ops):
                    results = await agent.command("parallel", ops=ops)
                    assert all(r["ok"] for r in results)

                nursery.start_soon(write)
        expected = {owned_subkey(parse_peer_id(w)) for w in writer_ids}
        for agent in agents:
            found = await agent.command("get", node=7, key="run/progress", latest=True)
            assert set(found["value"]) == expected
        # The 20 nodes nearest to the key (replication = k = 20) all hold all 8.
        target = key_of(b"run/progress")
        ranked = sorted(((a, n) for a in agents for n in range(NODES)), key=lambda an: distance(
            key_of(parse_peer_id(an[0].ready["nodes"][an[1]]["peer_id"]).to_bytes()), target))
        for agent, node in ranked[:20]:
            held = await agent.command("local", node=node, key="run/progress")
            assert set(held) == expected, "one of the 20 nearest nodes is missing subkeys"

        async with p2pdl.open_node(p2pdl.NodeConfig.build(
                loopback_config(), initial_peers=[agents[0].ready["nodes"][0]["addrs"][0]])
                ) as attacker:
            peers = []
            for agent in agents:
                for info in agent.ready["nodes"]:
                    peer = parse_peer_id(info["peer_id"])
                    attacker.host.add_addrs(peer, info["addrs"])
                    peers.append(peer)

            # -- a forged owned subkey is rejected by all 32 --------------------
            victim = writer_ids[0]
            subkey = owned_subkey(parse_peer_id(victim))
            raw = msgpack.packb({"writer": "forged"})
            expiration = time.time() + 3000  # later: it would win if accepted
            forged = WireItem(subkey, raw, expiration,
                              sign(attacker.host.libp2p.get_private_key(), "run/progress",
                                   subkey, raw, expiration))
            verdicts = []

            async def forge(peer):
                reply = await attacker.call(peer, DHT_PROTOCOL, Store("run/progress", [forged]))
                verdicts.append(reply.results[0])

            async with trio.open_nursery() as nursery:
                for peer in peers:
                    nursery.start_soon(forge, peer)
            assert len(verdicts) == 32 and all(v.startswith("bad_signature") for v in verdicts)
            for agent in agents:
                found = await agent.command("get", node=3, key="run/progress", latest=True)
                assert found["value"][subkey][0] == {"writer": "0.1"}

            # -- malformed and oversized messages: the nodes keep serving -------
            targets = [peers[p * NODES + 2] for p in range(PROCESSES)]
            for peer in targets:
                for payload in (b"\x09not a frame at all",
                                bytes([FrameKind.MESSAGE]) + (8 << 20).to_bytes(4, "big")
                                + b"\0" * 512,  # over the wire's frame limit
                                frame_header(FrameKind.MESSAGE, 2) + b"\x92\xc1"):
                    stream = await attacker.host.new_stream(peer, DHT_PROTOCOL.protocol_id)
                    await stream.write(payload)
                    with trio.fail_after(10):
                        try:
                            while await stream.read(65536):
                                pass
                        except Exception:  # reset or EOF: the node dropped the stream
                            pass
            for agent in agents:
                result = await agent.command("get", node=2, key="record-1", latest=True)
                assert result["found"] and result["value"] == 1

        # -- expired records are gone everywhere ----------------------------------
        assert (await agents[1].command("store", node=4, key="short-lived", value="soon gone",
                                        ttl=2))["ok"]
        assert (await agents[2].command("get", node=6, key="short-lived"))["found"]
        await trio.sleep(2.5)
        for agent in agents:
            for node in range(NODES):
                assert await agent.command("local", node=node, key="short-lived") == []
            assert not (await agent.command("get", node=0, key="short-lived",
                                            latest=True))["found"]

        # -- 25% of the nodes die at once; every record is still found -------------
        dead = agents[3]
        dead.process.kill()
        await dead.process.wait()
        survivors = [(a, i) for a in agents[:3] for i in range(NODES)]
        misses = []
        for n in range(RECORDS):
            agent, node = rng.choice(survivors)
            result = await agent.command("get", node=node, key=f"record-{n}", timeout=60)
            if not (result["found"] and result["value"] == n):
                misses.append(n)
        assert misses == []
        found = await agents[0].command("get", node=6, key="run/progress", latest=True)
        assert set(found["value"]) == expected  # entries of dead writers live on until expiry
