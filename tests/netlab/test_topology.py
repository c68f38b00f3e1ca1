"""Who reaches whom in the emulated internet, and what addresses they see."""

from __future__ import annotations

import errno
import ipaddress
import json

import pytest

from p2pdl.errors import ConfigError
from p2pdl.netlab import Internet, NatType, NetlabError, _topology

from .conftest import lab_names, read_line, run_peer, start_server

UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


def test_public_hosts_reach_each_other_and_see_each_others_addresses(net: Internet):
    relay = net.add_public_host("relay")
    other = net.add_public_host("other")
    server = start_server(relay, "serve", 7000)
    status, report = run_peer(other, "connect", relay.ip, 7000)
    assert status == 0, report
    assert report["seen"]["ip"] == other.ip
    assert json.loads(read_line(server)) == report["seen"]
    assert server.wait(timeout=5) == 0


def test_private_host_reaches_the_internet_as_its_gateways_public_address(net: Internet):
    relay = net.add_public_host("relay")
    gateway = net.add_nat("nat1")
    host = net.add_private_host("a", behind=gateway)
    assert ipaddress.ip_address(host.ip) in gateway.lan
    assert host.public_ip == gateway.public_ip != host.ip
    start_server(relay, "serve", 7000)
    status, report = run_peer(host, "connect", relay.ip, 7000)
    assert status == 0, report
    assert report["seen"]["ip"] == gateway.public_ip


@pytest.mark.parametrize("nat", list(NatType))
def test_nobody_on_the_internet_reaches_a_private_host(net: Internet, nat: NatType):
    relay = net.add_public_host("relay")
    gateway = net.add_nat("nat1", nat)
    host = net.add_private_host("a", behind=gateway)
    start_server(host, "serve", 7000, "--count", "3")
    # The private address is not routed on the internet: unreachable at once.
    status, report = run_peer(relay, "connect", host.ip, 7000, timeout=2)
    assert status == 1 and report["errno"] in UNREACHABLE, report
    # The gateway's public address and the same port: no port forwarding.
    status, report = run_peer(relay, "connect", gateway.public_ip, 7000, timeout=0.5)
    assert status == 1, report
    # Even with a route to the LAN through the gateway, it forwards no new connection.
    relay.run(["ip", "route", "add", str(gateway.lan), "via", gateway.public_ip], check=True)
    status, report = run_peer(relay, "connect", host.ip, 7000, timeout=0.5)
    assert status == 1 and report["error"] == "TimeoutError", report


def test_addresses_beyond_the_lab_fail_at_once(net: Internet):
    relay = net.add_public_host("relay")
    host = net.add_private_host("a", behind=net.add_nat("nat1"))
    # TEST-NET-3: the packets never leave the lab (it has no link to the
    # outside); the internet's router answers them with ICMP unreachable.
    for machine in (relay, host):
        status, report = run_peer(machine, "connect", "203.0.113.1", 7000, timeout=2)
        assert status == 1 and report["errno"] in UNREACHABLE, report


def test_private_hosts_on_one_lan_reach_each_other_but_not_other_lans(net: Internet):
    g1, g2 = net.add_nat("nat1"), net.add_nat("nat2")
    a, a2 = net.add_private_host("a", behind=g1), net.add_private_host("a2", behind=g1)
    b = net.add_private_host("b", behind=g2)
    assert g1.lan != g2.lan and not g1.lan.overlaps(g2.lan)
    start_server(a, "serve", 7000)
    status, report = run_peer(a2, "connect", a.ip, 7000)
    assert status == 0 and report["seen"]["ip"] == a2.ip, report
    status, report = run_peer(b, "connect", a.ip, 7000, timeout=0.5)
    assert status == 1, report


def test_addresses_names_and_description(net: Internet):
    relay = net.add_public_host("relay", rate_mbit=100)
    gateway = net.add_nat("nat1", NatType.SYMMETRIC, up_mbit=20)
    host = net.add_private_host("a", behind=gateway)
    for machine in (relay, gateway, host):
        assert machine.netns == f"p2nl-{net.run_id}-{machine.name}"
        assert net[machine.name] is machine
    assert net.netns == net.prefix == f"p2nl-{net.run_id}"
    assert ipaddress.ip_address(relay.ip) in net.public_net
    assert ipaddress.ip_address(gateway.public_ip) in net.public_net
    assert relay.is_public and not host.is_public and host.gateway is gateway
    assert gateway.hosts == [host] and net.hosts == [relay, host] and net.gateways == [gateway]
    assert host.run(["ip", "route", "show", "default"], capture_output=True,
                    text=True).stdout.startswith(f"default via {gateway.lan_ip}")
    text = net.describe()
    for fragment in (relay.netns, relay.ip, gateway.public_ip, host.ip, "NAT symmetric",
                     "100 Mbit/s", "up 20 Mbit/s, down uncapped", "private, behind nat1"):
        assert fragment in text


def test_misuse_is_a_clear_error(net: Internet):
    gateway = net.add_nat("nat1")
    with pytest.raises(ConfigError, match="already has a machine named 'nat1'"):
        net.add_public_host("nat1")
    with pytest.raises(ConfigError, match="invalid host name"):
        net.add_public_host("no spaces")
    with pytest.raises(ConfigError, match="invalid rate"):
        net.add_public_host("x", rate_mbit=0)
    with pytest.raises(ConfigError, match="NatGateway of this lab"):
        net.add_private_host("y", behind=net.add_public_host("z"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="argv must be a sequence"):
        gateway.run("ip addr")  # type: ignore[arg-type]
    net.close()
    with pytest.raises(NetlabError, match="closed"):
        net.add_public_host("late")
    with pytest.raises(NetlabError, match="closed"):
        gateway.run(["true"])


def test_a_machine_that_fails_half_way_is_removed(net: Internet,
                                                 monkeypatch: pytest.MonkeyPatch):
    def broken(*args: object, **kwargs: object) -> None:
        raise NetlabError("tc broke")

    monkeypatch.setattr(_topology, "shape", broken)
    with pytest.raises(NetlabError, match="tc broke"):
        net.add_public_host("relay", rate_mbit=10)
    assert lab_names(net.run_id) == [net.netns] and "relay" not in net.machines
    monkeypatch.undo()
    assert net.add_public_host("relay").netns in lab_names(net.run_id)


def test_bad_arguments_are_rejected_before_anything_is_built(lab_required: None):
    with pytest.raises(ConfigError, match="overlaps"):
        Internet(public_net="192.168.0.0/16")
    with pytest.raises(ConfigError, match="too small"):
        Internet(public_net="10.77.0.0/25")
    with pytest.raises(ConfigError, match="invalid public_net"):
        Internet(public_net="10.77.0.0/33")
    with pytest.raises(ConfigError, match="term_timeout"):
        Internet(term_timeout=-1)


def test_two_labs_side_by_side_are_independent(net: Internet):
    with Internet() as other:
        assert other.run_id != net.run_id
        mine, theirs = net.add_public_host("relay"), other.add_public_host("relay")
        assert mine.ip == theirs.ip and mine.netns != theirs.netns  # same address, apart
        start_server(mine, "serve", 7000)
        status, report = run_peer(other.add_public_host("x"), "connect", theirs.ip, 7000,
                                  timeout=2)
        assert status == 1 and report["error"] == "ConnectionRefusedError", report
    assert other.closed and not net.closed


def test_custom_networks(lab_required: None):
    with Internet(public_net="10.99.0.0/24", lan_net="172.20.0.0/16") as net:
        gateway = net.add_nat("nat1")
        host = net.add_private_host("a", behind=gateway)
        assert gateway.public_ip == "10.99.0.2" and net.router_ip == "10.99.0.1"
        assert host.ip == "172.20.1.2" and gateway.lan_ip == "172.20.1.1"
