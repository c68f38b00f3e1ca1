"""The emulated internet: a switch in its own namespace, hosts and NAT gateways on it.

::

                     namespace p2nl-<run>: "the internet"
             +------------------------------------------------+
             | bridge br0 10.77.0.1/16 (a router to nowhere)  |
             +----+-------------------+-------------------+---+
                  | veth              | veth              | veth
        p2nl-<run>-relay     p2nl-<run>-nat1       p2nl-<run>-nat2
        eth0 10.77.0.2       wan0 10.77.0.3        wan0 10.77.0.4
        (public host)        NAT keeping ports,    NAT with random ports,
                             dropping inbound      dropping inbound
                             lan0 192.168.1.1/24   lan0 192.168.2.1/24
                                  | veth                | veth
                             p2nl-<run>-a          p2nl-<run>-b
                             eth0 192.168.1.2      eth0 192.168.2.2

Public hosts reach each other and every gateway's public address; private
hosts reach the internet through their gateway and each other on their LAN;
nobody reaches a private host from outside.  The root namespace's networking
is never touched: every interface is created inside a lab namespace.
Addresses outside the lab's networks are unreachable: the internet's router
answers with ICMP unreachable, so a connect fails at once (EHOSTUNREACH or
ENETUNREACH) instead of hanging.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from types import MappingProxyType, TracebackType

from ..errors import ConfigError
from ._cleanup import deferred_signals, remove_run
from ._commands import PACKAGES, ip, ip_batch, nft, write_sysctl
from ._errors import NetlabError, NetlabUnavailable
from ._host import Host, Namespace, NatGateway
from ._names import check_host_name, claim_run_id, list_netns, netns_name, parse_netns
from ._nat import NatType, nat_ruleset
from ._shaping import Rate, shape

__all__ = ["Internet", "DEFAULT_PUBLIC_NET", "DEFAULT_LAN_NET", "preflight"]

logger = logging.getLogger("p2pdl.netlab")

#: The internet's addresses.  Private (RFC 1918) and rarely used, though a
#: clash would be harmless: the lab's addresses exist only inside its namespaces.
DEFAULT_PUBLIC_NET = "10.77.0.0/16"

#: Carved into one /24 per gateway: 192.168.1.0/24, 192.168.2.0/24, ...
DEFAULT_LAN_NET = "192.168.0.0/16"

#: Seconds processes in the lab get between SIGTERM and SIGKILL at close.
TERM_TIMEOUT = 5.0


def preflight() -> None:
    """The quick checks before building anything: root, and the three programs.

    Raises :class:`NetlabUnavailable` naming what is missing.  (The thorough
    check of kernel facilities is :func:`p2pdl.netlab.check`.)
    """
    problems = []
    if os.geteuid() != 0:
        problems.append(f"must run as root (running as uid {os.geteuid()}): network namespaces "
                        f"and NAT need CAP_SYS_ADMIN and CAP_NET_ADMIN")
    missing = [p for p in ("ip", "tc", "nft") if shutil.which(p) is None]
    if missing:
        packages = sorted({PACKAGES[p] for p in missing})
        problems.append(f"missing {', '.join(missing)} (Debian packages: {' '.join(packages)})")
    if problems:
        raise NetlabUnavailable("netlab cannot run here: " + "; ".join(problems))


class Internet:
    """One emulated internet; use as ``with Internet() as net:``, or call :meth:`close`.

    Creating it claims a run id and creates the internet's namespace (a
    bridge whose address is the public hosts' default router).  Then
    :meth:`add_public_host`, :meth:`add_nat` and :meth:`add_private_host`
    add machines, each a namespace named ``p2nl-<run>-<name>``.

    ``public_net`` is the internet's address range (at least a /24);
    ``lan_net`` is split into one /24 per gateway (at least a /23, not
    overlapping ``public_net``).  ``term_timeout`` is how long processes in
    the lab get between SIGTERM and SIGKILL at close.

    Everything is removed by :meth:`close`: at the end of the ``with`` block
    (also on an exception or Ctrl-C), or at interpreter exit if it was never
    closed.  Not thread-safe, except :meth:`close`.

    Raises :class:`NetlabUnavailable` if not root or ``ip``/``tc``/``nft`` are
    missing; :class:`~p2pdl.errors.ConfigError` for bad networks.
    """

    def __init__(self, *, public_net: str = DEFAULT_PUBLIC_NET,
                 lan_net: str = DEFAULT_LAN_NET, term_timeout: float = TERM_TIMEOUT) -> None:
        self.public_net = _network(public_net, "public_net", max_prefix=24)
        """The internet's address range."""
        self.lan_net = _network(lan_net, "lan_net", max_prefix=23)
        """The range the gateways' LANs are taken from."""
        if self.public_net.overlaps(self.lan_net):
            raise ConfigError(f"public_net {self.public_net} overlaps lan_net {self.lan_net}")
        if not term_timeout >= 0:
            raise ConfigError(f"term_timeout must be >= 0 seconds, not {term_timeout!r}")
        self.term_timeout = term_timeout
        self._closed = False
        self._close_lock = threading.Lock()
        self._machines: dict[str, Namespace] = {}
        self._children: list[subprocess.Popen] = []
        self._next_public = 2  # .1 is the router on the bridge
        self._next_lan = 1  # the first /24 (192.168.0.0/24: many a real LAN) stays unused
        self._next_port = 1
        preflight()
        taken = {parsed[0] for n in list_netns() if (parsed := parse_netns(n)) is not None}
        self.run_id = claim_run_id(taken)
        """Four hex digits; every namespace of this lab is named ``p2nl-<run_id>...``."""
        _register(self)
        self.netns = netns_name(self.run_id)
        """The internet's own namespace (it holds the bridge ``br0``)."""
        try:
            self._build_internet()
        except BaseException:
            self.close()
            raise

    # -- building --------------------------------------------------------------------------

    @property
    def router_ip(self) -> str:
        """The bridge's address: the default route of public hosts and gateways."""
        return str(self.public_net.network_address + 1)

    @property
    def prefix(self) -> str:
        """The common start of all this lab's namespace names."""
        return self.netns

    def _build_internet(self) -> None:
        ip(None, "netns", "add", self.netns)
        ip_batch(self.netns, [
            "link set lo up",
            "link add br0 type bridge",
            f"addr add {self.router_ip}/{self.public_net.prefixlen} dev br0",
            "link set br0 up",
        ])
        # The bridge's address is also a router that knows no route beyond the
        # lab: forwarding on, so that it answers packets for any other address
        # with ICMP unreachable (a connect fails at once instead of hanging),
        # and no rate limit on those answers, which tests provoke in bursts.
        write_sysctl(self.netns, "net.ipv4.ip_forward", "1")
        write_sysctl(self.netns, "net.ipv4.icmp_ratelimit", "0")

    @contextlib.contextmanager
    def _new_machine(self, name: str) -> Iterator[str]:
        """Create the namespace of machine ``name``; delete it again if building it fails."""
        self._check_open()
        check_host_name(name)
        if name in self._machines:
            raise ConfigError(f"this lab already has a machine named {name!r}")
        netns = netns_name(self.run_id, name)
        ip(None, "netns", "add", netns)
        try:
            yield netns
        except BaseException:
            # Half-built: remove it so the name can be used again (close()
            # would remove it anyway, as it removes everything of the run).
            ip(None, "netns", "delete", netns, check=False)
            raise

    def _new_port(self) -> str:
        port = f"port{self._next_port}"
        self._next_port += 1
        return port

    def _public_address(self) -> ipaddress.IPv4Interface:
        address = self.public_net.network_address + self._next_public
        if address >= self.public_net.broadcast_address:
            raise ConfigError(f"public_net {self.public_net} has no free address left")
        self._next_public += 1
        return ipaddress.IPv4Interface(f"{address}/{self.public_net.prefixlen}")

    def _plug_into_internet(self, netns: str, dev: str,
                            address: ipaddress.IPv4Interface) -> None:
        """Connect ``dev`` in ``netns`` to the internet's bridge, with ``address``."""
        port = self._new_port()
        ip_batch(netns, [
            "link set lo up",
            f"link add {dev} type veth peer name {port} netns {self.netns}",
            f"addr add {address} dev {dev}",
            f"link set {dev} up",
            f"route add default via {self.router_ip}",
        ])
        ip_batch(self.netns, [f"link set {port} master br0", f"link set {port} up"])

    def add_public_host(self, name: str, rate_mbit: float | None = None, *,
                        up_mbit: float | None = None,
                        down_mbit: float | None = None) -> Host:
        """Add a host with a public address, reachable from the whole internet.

        ``rate_mbit`` caps both directions of its link (Mbit/s, ``None``:
        uncapped); ``up_mbit``/``down_mbit`` override one direction.  Raises
        :class:`~p2pdl.errors.ConfigError` for a taken or invalid name or rate.
        """
        rate = Rate.build(rate_mbit, up_mbit, down_mbit)
        with self._new_machine(name) as netns:
            address = self._public_address()
            self._plug_into_internet(netns, "eth0", address)
            shape(netns, "eth0", rate)
        host = Host(name, netns, ip=address, gateway=None, rate=rate, track=self._track,
                    check_open=self._check_open)
        self._machines[name] = host
        return host

    def add_nat(self, name: str, nat: NatType = NatType.ENDPOINT_INDEPENDENT,
                rate_mbit: float | None = None, *, up_mbit: float | None = None,
                down_mbit: float | None = None) -> NatGateway:
        """Add a NAT gateway with a public address and an empty LAN of its own.

        ``nat`` says how it maps and filters (see :class:`NatType`).  A rate
        caps its WAN link, shared by all its private hosts (a household's
        uplink).  Raises :class:`~p2pdl.errors.ConfigError` for a taken or
        invalid name or rate, or when ``lan_net`` has no /24 left.
        """
        if not isinstance(nat, NatType):
            raise ConfigError(f"nat must be a NatType, not {nat!r}")
        rate = Rate.build(rate_mbit, up_mbit, down_mbit)
        lans = list(self.lan_net.subnets(new_prefix=24))
        if self._next_lan >= len(lans):
            raise ConfigError(f"lan_net {self.lan_net} has no free /24 left")
        lan = lans[self._next_lan]
        lan_interface = ipaddress.IPv4Interface(f"{lan.network_address + 1}/{lan.prefixlen}")
        with self._new_machine(name) as netns:
            address = self._public_address()
            self._next_lan += 1
            self._plug_into_internet(netns, "wan0", address)
            ip_batch(netns, [
                "link add lan0 type bridge",
                f"addr add {lan_interface} dev lan0",
                "link set lan0 up",
            ])
            write_sysctl(netns, "net.ipv4.ip_forward", "1")
            nft(netns, nat_ruleset(nat, wan="wan0"))
            shape(netns, "wan0", rate)
        gateway = NatGateway(name, netns, public=address, lan=lan_interface, nat=nat, rate=rate,
                             track=self._track, check_open=self._check_open)
        self._machines[name] = gateway
        return gateway

    def add_private_host(self, name: str, behind: NatGateway, rate_mbit: float | None = None,
                         *, up_mbit: float | None = None,
                         down_mbit: float | None = None) -> Host:
        """Add a host on the LAN of gateway ``behind``; it reaches the internet through it.

        It gets the next free address of the gateway's /24 and a default
        route via the gateway.  Rates as for :meth:`add_public_host`.  Raises
        :class:`~p2pdl.errors.ConfigError` for a taken or invalid name or
        rate, a gateway of another lab, or a full LAN.
        """
        if not isinstance(behind, NatGateway) or self._machines.get(behind.name) is not behind:
            raise ConfigError(f"behind must be a NatGateway of this lab, not {behind!r}")
        rate = Rate.build(rate_mbit, up_mbit, down_mbit)
        lan = behind.lan
        address = lan.network_address + 2 + len(behind.hosts)
        if address >= lan.broadcast_address:
            raise ConfigError(f"the LAN {lan} of {behind.name!r} is full")
        interface = ipaddress.IPv4Interface(f"{address}/{lan.prefixlen}")
        with self._new_machine(name) as netns:
            port = self._new_port()
            ip_batch(netns, [
                "link set lo up",
                f"link add eth0 type veth peer name {port} netns {behind.netns}",
                f"addr add {interface} dev eth0",
                "link set eth0 up",
                f"route add default via {behind.lan_ip}",
            ])
            ip_batch(behind.netns, [f"link set {port} master lan0", f"link set {port} up"])
            shape(netns, "eth0", rate)
        host = Host(name, netns, ip=interface, gateway=behind, rate=rate, track=self._track,
                    check_open=self._check_open)
        behind.hosts.append(host)
        self._machines[name] = host
        return host

    # -- looking things up -----------------------------------------------------------------

    @property
    def machines(self) -> Mapping[str, Namespace]:
        """Every host and gateway by name, in the order they were added (read-only)."""
        return MappingProxyType(self._machines)

    @property
    def hosts(self) -> list[Host]:
        """The public and private hosts, in the order they were added."""
        return [m for m in self._machines.values() if isinstance(m, Host)]

    @property
    def gateways(self) -> list[NatGateway]:
        """The NAT gateways, in the order they were added."""
        return [m for m in self._machines.values() if isinstance(m, NatGateway)]

    def __getitem__(self, name: str) -> Namespace:
        return self._machines[name]

    def __iter__(self) -> Iterator[Namespace]:
        return iter(list(self._machines.values()))

    def describe(self) -> str:
        """A table of the machines: name, kind, namespace, addresses, caps."""
        rows = [("name", "kind", "namespace", "address", "public address", "caps")]
        for m in self._machines.values():
            if isinstance(m, NatGateway):
                rows.append((m.name, f"NAT {m.nat.value}", m.netns, f"{m.lan_ip} (LAN)",
                             m.public_ip, str(m.rate)))
            elif isinstance(m, Host):
                kind = "public" if m.gateway is None else f"private, behind {m.gateway.name}"
                rows.append((m.name, kind, m.netns, m.ip, m.public_ip, str(m.rate)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                 for row in rows]
        head = (f"run {self.run_id}: internet {self.public_net} in namespace {self.netns}, "
                f"router {self.router_ip}")
        return "\n".join([head, *lines])

    # -- closing ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (the lab is gone)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise NetlabError(f"lab run {self.run_id} is closed")

    def _track(self, proc: subprocess.Popen) -> None:
        # Forget children that have exited, so the list stays as long as the
        # number of programs actually running.
        self._children = [c for c in self._children if c.poll() is None]
        self._children.append(proc)

    def close(self) -> None:
        """Stop every process in the lab, then delete all its namespaces.

        Processes get SIGTERM, then SIGKILL after ``term_timeout`` seconds.
        Idempotent and safe to call from any thread or at interpreter exit; a
        Ctrl-C or SIGTERM during close (main thread) is held back until it is
        done.
        Raises :class:`NetlabError` if something could not be removed (then
        ``python -m p2pdl.netlab cleanup`` retries later).
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            with deferred_signals():
                remove_run(self.run_id, term_timeout=self.term_timeout,
                           children=self._children)
        finally:
            _unregister(self)

    def __enter__(self) -> Internet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except NetlabError:
            if exc is None:
                raise
            # The body's error matters more; do not hide it behind ours.
            logger.exception("netlab: cleaning up run %s failed", self.run_id)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._machines)} machines"
        return f"<Internet run={self.run_id} {state}>"


def _network(value: str, what: str, *, max_prefix: int) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid {what} {value!r}: {exc}") from None
    if net.prefixlen > max_prefix:
        raise ConfigError(f"{what} {net} is too small: /{max_prefix} or larger expected")
    return net


# -- interpreter exit --------------------------------------------------------------------------

_open_labs: dict[int, Internet] = {}
_open_labs_lock = threading.Lock()


def _register(net: Internet) -> None:
    with _open_labs_lock:
        _open_labs[id(net)] = net


def _unregister(net: Internet) -> None:
    with _open_labs_lock:
        _open_labs.pop(id(net), None)


@atexit.register
def _close_open_labs() -> None:
    """The fallback for labs never closed: a script that forgot ``with``, an exit()."""
    with _open_labs_lock:
        labs = list(_open_labs.values())
    for net in labs:
        try:
            net.close()
        except Exception:
            logger.exception("netlab: closing run %s at exit failed", net.run_id)
