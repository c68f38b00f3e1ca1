"""NAT traversal across real NATs in the emulated internet (p2pdl.netlab).

Each test builds its own small internet of network namespaces: relays on
public hosts, peers behind NAT gateways, every peer a separate process (an
agent) inside its host.  Skipped where the lab cannot run (not root, no
ip/nft/tc); CI runs them as root.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from p2pdl import netlab
from p2pdl.netlab import Internet, NatType
from p2pdl.testing import Agent, AgentError, open_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PORT = 4001
MiB = 1 << 20


@pytest.fixture
def lab():
    ok, reason = netlab.available()
    if not ok:
        pytest.skip(reason)
    with Internet(term_timeout=2.0) as net:
        yield net


def listen() -> list[str]:
    return ["--listen", f"/ip4/0.0.0.0/tcp/{PORT}"]


@asynccontextmanager
async def agent(host, *args: str) -> AsyncIterator[Agent]:
    async with open_agent([*listen(), *args], open_process=host.open_process) as a:
        yield a


def address(a: Agent, host) -> str:
    """The agent's address on its host's own interface (not loopback)."""
    return a.address_on(host.ip)


async def eventually(check, timeout: float, interval: float = 0.2):
    """Poll an async ``check`` until it returns something truthy (bounded)."""
    with trio.fail_after(timeout):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(interval)


async def circuit_of(a: Agent, timeout: float = 20) -> str:
    return await a.wait_for_circuit(timeout)


async def status_is(a: Agent, key: str, value, timeout: float = 30):
    async def check():
        return (await a.command("status"))[key] == value
    await eventually(check, timeout)


def rx_bytes(host) -> int:
    out = host.run(["cat", "/sys/class/net/eth0/statistics/rx_bytes"], capture_output=True,
                   text=True, check=True)
    return int(out.stdout)


def two_nats(lab: Internet, nat: NatType):
    relay = lab.add_public_host("relay")
    g1, g2 = lab.add_nat("nat1", nat=nat), lab.add_nat("nat2", nat=nat)
    return relay, lab.add_private_host("a", behind=g1), lab.add_private_host("b", behind=g2)


async def test_private_peers_exchange_data_through_a_relay(lab):
    """(a) A and B behind two NATs talk through public relay R."""
    relay_host, a_host, b_host = two_nats(lab, NatType.ENDPOINT_INDEPENDENT)
    async with agent(relay_host, "--relay") as r:
        boot = address(r, relay_host)
        async with agent(a_host, "--initial-peers", boot, "--no-hole-punching") as a, \
                agent(b_host, "--initial-peers", boot, "--no-hole-punching") as b:
            circuit = await circuit_of(a)
            assert await b.command("connect", addr=circuit) == a.peer_id
            before = rx_bytes(relay_host)
            sent = await b.command("send", peer=a.peer_id, mib=8)
            assert sent["path"] == "relayed"
            assert rx_bytes(relay_host) - before > 8 * MiB  # every byte passed through R
            assert (await a.command("status"))["paths"][b.peer_id] == "relayed"


async def test_hole_punching_upgrades_to_direct_and_traffic_leaves_the_relay(lab):
    """(b) with endpoint-independent NATs, DCUtR makes A-B direct; R's counters prove it."""
    relay_host, a_host, b_host = two_nats(lab, NatType.ENDPOINT_INDEPENDENT)
    async with agent(relay_host, "--relay") as r:
        boot = address(r, relay_host)
        async with agent(a_host, "--initial-peers", boot) as a, \
                agent(b_host, "--initial-peers", boot) as b:
            await b.command("connect", addr=await circuit_of(a))
            await b.command("wait_path", peer=a.peer_id, path="hole-punched", timeout=40)
            before = rx_bytes(relay_host)
            sent = await b.command("send", peer=a.peer_id, mib=32)
            through_relay = rx_bytes(relay_host) - before
            assert sent["path"] == "hole-punched"
            assert through_relay < 2 * MiB, through_relay  # 32 MiB went around R


async def test_public_hosts_are_direct_not_hole_punched(lab):
    """Two public hosts that also know a relay: their connection is ``direct`` on
    both sides, and stays so while DCUtR's driver runs (every 2 s)."""
    relay_host = lab.add_public_host("relay")
    p1, p2 = lab.add_public_host("pub1"), lab.add_public_host("pub2")
    async with agent(relay_host, "--relay") as r:
        boot = address(r, relay_host)
        async with agent(p1, "--initial-peers", boot) as a, \
                agent(p2, "--initial-peers", boot) as b:
            await b.command("connect", addr=address(a, p1))
            await trio.sleep(5)
            sent = await b.command("send", peer=a.peer_id, mib=4)
            assert sent["path"] == "direct", sent
            assert (await a.command("status"))["paths"][b.peer_id] == "direct"
            assert (await b.command("status"))["paths"][r.peer_id] == "direct"


async def test_symmetric_nats_stay_relayed_and_keep_working(lab):
    """(c) port-randomising NATs: hole punching fails, the relay carries the traffic."""
    relay_host, a_host, b_host = two_nats(lab, NatType.SYMMETRIC)
    async with agent(relay_host, "--relay") as r:
        boot = address(r, relay_host)
        async with agent(a_host, "--initial-peers", boot) as a, \
                agent(b_host, "--initial-peers", boot) as b:
            await b.command("connect", addr=await circuit_of(a))
            await trio.sleep(8)  # DCUtR tries (and fails) meanwhile
            before = rx_bytes(relay_host)
            sent = await b.command("send", peer=a.peer_id, mib=8)
            assert sent["path"] == "relayed"
            assert rx_bytes(relay_host) - before > 8 * MiB
            assert await b.command("ping", peer=a.peer_id) < 5


async def test_a_private_peer_reserves_on_a_relay_it_found_in_the_dht(lab):
    """A's only initial peer P is no relay; relay R joined through P and
    announced itself in the DHT, where A finds it and reserves on it."""
    p_host, r_host = lab.add_public_host("plain"), lab.add_public_host("relay")
    a_host = lab.add_private_host("a", behind=lab.add_nat("nat1"))
    async with agent(p_host) as p:
        p_addr = address(p, p_host)
        async with agent(r_host, "--relay", "--initial-peers", p_addr) as r:
            await status_is(r, "reachability", "public", timeout=60)
            async with agent(a_host, "--initial-peers", p_addr, "--no-hole-punching") as a:
                await status_is(a, "reservations", [r.peer_id], timeout=90)
                assert f"/p2p/{r.peer_id}/p2p-circuit/p2p/{a.peer_id}" in await circuit_of(a)


async def test_relay_dies_and_the_peer_is_reached_through_another(lab):
    """(d) R1 is killed: A reserves on R2 and B reaches A again, in bounded time."""
    r1_host, r2_host = lab.add_public_host("relay1"), lab.add_public_host("relay2")
    g1, g2 = lab.add_nat("nat1"), lab.add_nat("nat2", nat=NatType.SYMMETRIC)
    a_host, b_host = lab.add_private_host("a", behind=g1), lab.add_private_host("b", behind=g2)
    async with agent(r2_host, "--relay") as r2:
        r2_addr = address(r2, r2_host)
        async with agent(r1_host, "--relay") as r1:
            r1_addr = address(r1, r1_host)
            async with agent(a_host, "--initial-peers", r1_addr, r2_addr,
                             "--relay-reservations", "1", "--no-hole-punching") as a, \
                    agent(b_host, "--initial-peers", r2_addr, "--no-hole-punching") as b:
                await status_is(a, "reservations", [r1.peer_id])
                await b.command("connect", addr=await circuit_of(a))
                r1.process.kill()  # the relay crashes
                start = trio.current_time()
                await status_is(a, "reservations", [r2.peer_id], timeout=20)
                reserved = trio.current_time() - start

                async def reached():
                    try:
                        return await b.command("ping", peer=a.peer_id, timeout=5)
                    except AgentError:
                        return None
                await eventually(reached, timeout=30, interval=0.5)
                total = trio.current_time() - start
                print(f"failover: reserved on R2 after {reserved:.2f} s, "
                      f"B reached A after {total:.2f} s")
                assert total < 20


async def test_reachability_public_private_and_dead_address(lab):
    """(e) public hosts: public; NATed hosts: private; a dead announced address: never public."""
    relay_host, public_host = lab.add_public_host("relay"), lab.add_public_host("pub")
    liar_host = lab.add_public_host("liar")
    a_host = lab.add_private_host("a", behind=lab.add_nat("nat1"))
    async with agent(relay_host, "--relay") as r:
        boot = address(r, relay_host)
        dead = f"/ip4/{liar_host.ip}/tcp/{PORT + 1}"
        async with agent(public_host, "--initial-peers", boot) as p, \
                agent(a_host, "--initial-peers", boot) as a, \
                agent(liar_host, "--initial-peers", boot, "--announce", dead) as liar:
            await status_is(p, "reachability", "public")
            await status_is(r, "reachability", "public")
            await status_is(a, "reachability", "private")
            assert (await a.command("status"))["client_mode"] is True
            assert (await p.command("status"))["client_mode"] is False
            await status_is(liar, "reachability", "private")
            for _ in range(5):
                await trio.sleep(0.5)
                assert (await liar.command("status"))["reachability"] == "private"
