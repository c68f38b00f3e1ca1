"""Hosts and gateways: a network namespace you can run programs in.

:class:`Namespace` is what every lab machine has: a namespace name and ways
to run a program inside it (sync: :meth:`~Namespace.run`,
:meth:`~Namespace.popen`; trio: :meth:`~Namespace.open_process`).  Programs
started here are stopped when the lab closes (SIGTERM, then SIGKILL), in
fact every process found in the namespace is.  Objects of these classes are
made by :class:`~p2pdl.netlab.Internet`, never directly.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ..errors import ConfigError
from ._commands import exec_prefix
from ._nat import NatType
from ._shaping import Rate

__all__ = ["Namespace", "Host", "NatGateway"]

#: Default timeout of :meth:`Namespace.run`, in seconds.
RUN_TIMEOUT = 60.0


class Namespace:
    """A lab machine: one network namespace, named ``p2nl-<run>-<name>``."""

    def __init__(self, name: str, netns: str, *, rate: Rate,
                 track: Callable[[subprocess.Popen], None],
                 check_open: Callable[[], None]) -> None:
        self.name = name
        """The name given when it was added (unique in its :class:`Internet`)."""
        self.netns = netns
        """The network namespace, for ``ip netns exec NETNS ...`` by hand."""
        self.rate = rate
        """The bandwidth caps of its link (:class:`~p2pdl.netlab.Rate`)."""
        self._track = track
        self._check_open = check_open

    @property
    def ip(self) -> str:
        """Its main address: a host's own, a gateway's public one."""
        raise NotImplementedError

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside this namespace (``ip netns exec``).

        For starting a program some other way, e.g. ``trio.run_process``.
        Such programs are stopped at close like all others in the namespace.
        """
        if isinstance(argv, str | bytes):
            raise ConfigError("argv must be a sequence of arguments, not one string")
        return [*exec_prefix(self.netns), *map(str, argv)]

    def run(self, argv: Sequence[str], *, timeout: float | None = RUN_TIMEOUT,
            **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` inside this namespace and wait for it (:func:`subprocess.run`).

        Keyword arguments go to :func:`subprocess.run` (``check``,
        ``capture_output``, ``text``, ``input``, ``env``...).  ``timeout``
        defaults to :data:`RUN_TIMEOUT` seconds; past it the program is killed
        and :class:`subprocess.TimeoutExpired` is raised.
        """
        self._check_open()
        return subprocess.run(self.command(argv), timeout=timeout, **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside this namespace (:class:`subprocess.Popen`); do not wait.

        The child's pid is the program's own (``ip netns exec`` execs it).  It
        is terminated when the lab closes, if it still runs then.
        """
        self._check_open()
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self._track(proc)
        return proc

    async def open_process(self, argv: Sequence[str], **kwargs: Any) -> trio.Process:
        """Start ``argv`` inside this namespace from trio (:func:`trio.lowlevel.open_process`).

        Keyword arguments go to ``open_process`` (``stdin``, ``stdout``,
        ``stderr``, ``env``...).  The caller owns the process and should
        ``await process.wait()``; if it is still running when the lab closes,
        it is terminated then.
        """
        self._check_open()
        return await trio.lowlevel.open_process(self.command(argv), **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} netns={self.netns!r}>"


class Host(Namespace):
    """A machine that runs peers: on the internet (public) or behind a :class:`NatGateway`.

    Its single interface is ``eth0``; its default route leads to the internet
    (through its gateway, for a private host).
    """

    def __init__(self, name: str, netns: str, *, ip: ipaddress.IPv4Interface,
                 gateway: NatGateway | None, rate: Rate,
                 track: Callable[[subprocess.Popen], None],
                 check_open: Callable[[], None]) -> None:
        super().__init__(name, netns, rate=rate, track=track, check_open=check_open)
        self.interface = ip
        """``eth0``'s address with its prefix length."""
        self.gateway = gateway
        """The gateway it sits behind, ``None`` for a public host."""

    @property
    def ip(self) -> str:
        """Its own address: public for a public host, on its LAN for a private one."""
        return str(self.interface.ip)

    @property
    def public_ip(self) -> str:
        """The address hosts on the internet see it connect from (its gateway's if private)."""
        return self.gateway.public_ip if self.gateway is not None else self.ip

    @property
    def is_public(self) -> bool:
        """Whether it has a public address (reachable from the whole internet)."""
        return self.gateway is None


class NatGateway(Namespace):
    """A NAT router: ``wan0`` on the internet, ``lan0`` towards its private hosts.

    It forwards (``ip_forward=1``), translates on ``wan0`` as its
    :class:`~p2pdl.netlab.NatType` says, and lets no new connection in from
    the internet.  Its private hosts share its caps (``rate``: the
    household's uplink), on top of their own.
    """

    def __init__(self, name: str, netns: str, *, public: ipaddress.IPv4Interface,
                 lan: ipaddress.IPv4Interface, nat: NatType, rate: Rate,
                 track: Callable[[subprocess.Popen], None],
                 check_open: Callable[[], None]) -> None:
        super().__init__(name, netns, rate=rate, track=track, check_open=check_open)
        self.wan_interface = public
        """``wan0``'s address with its prefix length."""
        self.lan_interface = lan
        """``lan0``'s address; its network is the LAN's."""
        self.nat = nat
        """How it maps and filters (:class:`~p2pdl.netlab.NatType`)."""
        self.hosts: list[Host] = []
        """Its private hosts, in the order they were added."""

    @property
    def public_ip(self) -> str:
        """Its address on the internet: what its private hosts appear as."""
        return str(self.wan_interface.ip)

    @property
    def ip(self) -> str:
        """Same as :attr:`public_ip`."""
        return self.public_ip

    @property
    def lan_ip(self) -> str:
        """Its address on its LAN: the private hosts' default gateway."""
        return str(self.lan_interface.ip)

    @property
    def lan(self) -> ipaddress.IPv4Network:
        """The LAN behind it, e.g. ``192.168.1.0/24``."""
        return self.lan_interface.network
