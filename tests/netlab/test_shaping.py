"""Bandwidth caps: the tc parameters, and measured TCP throughput through them."""

from __future__ import annotations

import pytest

from p2pdl.errors import ConfigError
from p2pdl.netlab import Host, Internet, NetlabError, Rate, measure_throughput
from p2pdl.netlab._shaping import MIN_BURST_BYTES, MIN_QUEUE_BYTES, tbf_args

from .conftest import start_server

#: A capped transfer must reach this share of the cap and not exceed the upper
#: bound (TCP payload counts, headers do not, so 100 % is out of reach).
LOW, HIGH = 0.80, 1.05


def test_rates_default_to_rate_mbit_and_validate():
    assert Rate.build(None) == Rate(None, None)
    assert Rate.build(100) == Rate(100.0, 100.0)
    assert Rate.build(100, down_mbit=20) == Rate(100.0, 20.0)
    assert Rate.build(None, up_mbit=5) == Rate(5.0, None)
    assert str(Rate(100.0, 100.0)) == "100 Mbit/s"
    assert str(Rate(5.0, None)) == "up 5 Mbit/s, down uncapped"
    for bad in (0, -1, float("nan"), float("inf"), "100", True):
        with pytest.raises(ConfigError, match="invalid rate"):
            Rate.build(bad)  # type: ignore[arg-type]


def test_tbf_bucket_and_queue_grow_with_the_rate():
    assert tbf_args(1) == ["rate", "1000000bit", "burst", str(MIN_BURST_BYTES),
                           "limit", str(MIN_BURST_BYTES + MIN_QUEUE_BYTES)]
    assert tbf_args(0.5)[:2] == ["rate", "500000bit"]
    assert tbf_args(100)[3:] == ["62500", "limit", str(62500 + 625000)]  # 5 ms, 50 ms
    assert tbf_args(1000)[3] == "625000"


def _mbit_per_s(sender: Host, receiver: Host, nbytes: int) -> float:
    result = measure_throughput(sender, receiver, nbytes, timeout=20)
    assert result.bytes == nbytes
    return result.mbit_per_s


@pytest.mark.parametrize("rate", [100, 50])
def test_upload_and_download_caps_of_a_public_host(net: Internet, rate: int):
    capped = net.add_public_host("capped", rate_mbit=rate)
    other = net.add_public_host("other")
    nbytes = rate * 1_000_000 // 8 // 2  # half a second at the cap
    up = _mbit_per_s(capped, other, nbytes)  # egress tbf
    down = _mbit_per_s(other, capped, nbytes)  # ingress through the IFB
    assert LOW * rate <= up <= HIGH * rate, up
    assert LOW * rate <= down <= HIGH * rate, down


def test_asymmetric_caps_of_a_private_host(net: Internet):
    relay = net.add_public_host("relay")
    host = net.add_private_host("a", behind=net.add_nat("nat1"), up_mbit=20, down_mbit=80)
    up = _mbit_per_s(host, relay, 1_250_000)
    down = _mbit_per_s(relay, host, 5_000_000)
    assert LOW * 20 <= up <= HIGH * 20, up
    assert LOW * 80 <= down <= HIGH * 80, down


def test_a_gateway_cap_is_shared_by_its_hosts(net: Internet):
    relay = net.add_public_host("relay")
    gateway = net.add_nat("nat1", rate_mbit=40)
    host = net.add_private_host("a", behind=gateway)  # uncapped itself
    up = _mbit_per_s(host, relay, 2_500_000)
    down = _mbit_per_s(relay, host, 2_500_000)  # IFB before conntrack un-NATs it
    assert LOW * 40 <= up <= HIGH * 40, up
    assert LOW * 40 <= down <= HIGH * 40, down


def test_uncapped_links_are_much_faster_than_the_caps(net: Internet):
    a, b = net.add_public_host("a"), net.add_public_host("b")
    assert _mbit_per_s(a, b, 50_000_000) > 500


def test_measuring_between_unreachable_hosts_or_on_a_busy_port_is_an_error(net: Internet):
    a = net.add_private_host("a", behind=net.add_nat("nat1"))
    b = net.add_private_host("b", behind=net.add_nat("nat2"))
    with pytest.raises(ConfigError, match="behind different NATs"):
        measure_throughput(a, b, 1000)
    relay = net.add_public_host("relay")
    blocker = start_server(relay, "serve", 5201)
    with pytest.raises(NetlabError, match="did not start.*Address already in use"):
        measure_throughput(a, relay, 1000, port=5201)
    assert blocker.poll() is None
