"""NAT behaviours: port mapping, filtering, and whether TCP hole punching works."""

from __future__ import annotations

import errno
import json
import subprocess
import time

import pytest

from p2pdl.netlab import Internet, NatType
from p2pdl.netlab._nat import nat_ruleset

from .conftest import peer_argv, run_peer, start_server


def test_rulesets_differ_only_where_the_types_differ():
    eim = nat_ruleset(NatType.ENDPOINT_INDEPENDENT)
    sym = nat_ruleset(NatType.SYMMETRIC)
    rej = nat_ruleset(NatType.ENDPOINT_INDEPENDENT_REJECT)
    assert 'oifname "wan0" masquerade\n' in eim and "masquerade fully-random" in sym
    assert sym.replace(" fully-random", "") == eim
    assert "reject with tcp reset" in rej and "reject" not in eim
    for ruleset in (eim, sym, rej):  # never a new connection in from the internet
        assert ruleset.count('iifname "wan0" ct state established,related accept') == 2
    assert [nat for nat in NatType if nat.hole_punching] == [NatType.ENDPOINT_INDEPENDENT]


def _seen_ports(net: Internet, nat: NatType) -> tuple[int, list[int]]:
    """Connect from one private port to two public servers; the ports they saw."""
    servers = [net.add_public_host("s1"), net.add_public_host("s2")]
    gateway = net.add_nat("nat1", nat)
    host = net.add_private_host("a", behind=gateway)
    for server in servers:
        start_server(server, "serve", 7000)
    local_port = 40123
    seen = []
    for server in servers:
        status, report = run_peer(host, "connect", server.ip, 7000, "--bind-port", local_port)
        assert status == 0, report
        assert report["local_port"] == local_port
        assert report["seen"]["ip"] == gateway.public_ip
        seen.append(report["seen"]["port"])
    return local_port, seen


def test_endpoint_independent_nat_keeps_the_source_port_for_every_destination(net: Internet):
    local_port, seen = _seen_ports(net, NatType.ENDPOINT_INDEPENDENT)
    assert seen == [local_port, local_port]


def test_symmetric_nat_gives_each_connection_its_own_random_port(net: Internet):
    local_port, seen = _seen_ports(net, NatType.SYMMETRIC)
    assert local_port not in seen  # 1 in 64512 per connection to fail by chance
    assert seen[0] != seen[1]


@pytest.mark.parametrize(("nat", "expected"), [
    (NatType.ENDPOINT_INDEPENDENT, "TimeoutError"),          # dropped: the dialler waits
    (NatType.SYMMETRIC, "TimeoutError"),
    (NatType.ENDPOINT_INDEPENDENT_REJECT, "ConnectionRefusedError"),  # RST at once
])
def test_unsolicited_inbound_is_dropped_or_rejected(net: Internet, nat: NatType, expected: str):
    relay = net.add_public_host("relay")
    gateway = net.add_nat("nat1", nat)
    status, report = run_peer(relay, "connect", gateway.public_ip, 4001, timeout=0.5)
    assert status == 1 and report["error"] == expected, report


def _punch(net: Internet, nat_a: NatType, nat_b: NatType, timeout: float) -> list[dict]:
    """Private ``a`` and ``b`` dial each other's gateway from ports 4001 and 4002.

    ``b`` dials first and ``a`` 0.2 s later, so ``b``'s first SYN always
    reaches ``a``'s gateway before ``a``'s own SYN left it: the order in which
    a dropping gateway is harmless and a rejecting one is fatal.
    """
    g1, g2 = net.add_nat("nat1", nat_a), net.add_nat("nat2", nat_b)
    a, b = net.add_private_host("a", behind=g1), net.add_private_host("b", behind=g2)
    procs = [b.popen(peer_argv("punch", 4002, g1.public_ip, 4001, timeout=timeout),
                     stdout=subprocess.PIPE, text=True)]
    time.sleep(0.2)
    procs.append(a.popen(peer_argv("punch", 4001, g2.public_ip, 4002, timeout=timeout),
                         stdout=subprocess.PIPE, text=True))
    return [json.loads(p.communicate(timeout=timeout + 10)[0].strip().splitlines()[-1])
            for p in procs]


def test_hole_punching_succeeds_between_endpoint_independent_nats(net: Internet):
    reports = _punch(net, NatType.ENDPOINT_INDEPENDENT, NatType.ENDPOINT_INDEPENDENT, 5)
    assert all(r["ok"] for r in reports), reports
    # Each saw the other's gateway and kept port: one direct connection, no relay.
    assert reports[0]["peer"] == [net["nat1"].public_ip, 4001]
    assert reports[1]["peer"] == [net["nat2"].public_ip, 4002]


@pytest.mark.parametrize("nat_b", [NatType.SYMMETRIC, NatType.ENDPOINT_INDEPENDENT_REJECT])
def test_hole_punching_fails_through_symmetric_or_rejecting_nats(net: Internet, nat_b: NatType):
    # a's gateway is the one that differs: the SYN of b (behind an endpoint-
    # independent gateway) meets it first.
    reports = _punch(net, nat_b, NatType.ENDPOINT_INDEPENDENT, 1.5)
    assert not any(r["ok"] for r in reports), reports
    if nat_b is NatType.ENDPOINT_INDEPENDENT_REJECT:
        assert reports[0]["errno"] == errno.ECONNREFUSED, reports
