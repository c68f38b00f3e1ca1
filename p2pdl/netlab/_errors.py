"""The errors of the emulated internet."""

from __future__ import annotations

from ..errors import P2PDLError

__all__ = ["NetlabError", "NetlabUnavailable"]


class NetlabError(P2PDLError):
    """A command that builds or removes the lab failed or timed out.

    The message names the command and repeats what it wrote on stderr.
    """


class NetlabUnavailable(NetlabError):
    """The lab cannot run on this machine; the message says what is missing.

    Causes: not running as root, ``ip``/``nft``/``tc`` not installed (Debian
    packages ``iproute2`` and ``nftables``), or a kernel facility the lab needs
    (network namespaces, veth, bridges, nftables NAT, tbf, ifb) is absent.
    :func:`p2pdl.netlab.available` reports the same reason without raising.
    """
