"""NAT behaviours of gateways, as nftables rulesets.

Every gateway translates on its WAN side (``wan0``) and never lets a new
connection in from the internet: the forward chain drops anything from
``wan0`` that conntrack does not know, so private hosts are unreachable from
the internet whatever the NAT type.  The types differ in the two properties
that decide whether TCP hole punching (simultaneous open, as in libp2p's
DCUtR) can work:

* the *mapping*: does a private host's connection keep its source port on the
  gateway's public address (Linux ``masquerade`` keeps it when it is free), or
  does each connection get a random one (``masquerade fully-random``)?
* the *filtering* of unsolicited packets to the gateway itself: silently
  dropped (home routers), or answered with a TCP RST / ICMP error, which
  tears down the other side's half-open punch.

Measured on this kind of machine (docs/netlab.md, notes/netlab.md): DCUtR
succeeded 4 of 4 times between two ``ENDPOINT_INDEPENDENT`` gateways, and
failed with RST-answering and with port-randomising gateways.
"""

from __future__ import annotations

import enum

__all__ = ["NatType", "nat_ruleset"]

#: The nftables table every gateway's rules live in.
TABLE = "p2nl"


class NatType(enum.Enum):
    """How a gateway maps and filters; decides whether hole punching can work.

    ``ENDPOINT_INDEPENDENT``
        Port-preserving mapping (plain ``masquerade``: a private host's
        connection from port P leaves the gateway from its public address and
        port P, unless another private host already uses P there), and
        unsolicited inbound packets are *dropped*, like a typical home
        router.  The mapping is the same for every destination, so a peer
        that learned our public address and port from a third party can
        punch through: **TCP hole punching (simultaneous open) succeeds**
        when both sides dial each other at about the same time from their
        listen port.

    ``SYMMETRIC``
        Port-randomising mapping (``masquerade fully-random``: every
        connection gets a random public port, so the port seen by one
        destination tells nothing about the next), same dropping of
        unsolicited inbound.  The punching peer aims at a port that is not
        mapped: **hole punching fails**; only a relay can connect such a host
        to another NATed host.

    ``ENDPOINT_INDEPENDENT_REJECT``
        Port-preserving mapping as ``ENDPOINT_INDEPENDENT``, but unsolicited
        inbound TCP to the gateway is answered with an RST (other protocols:
        ICMP port unreachable), as a Linux box with no firewall does.  The
        first SYN of a punch that arrives before this side's own SYN left
        draws an RST that aborts the other side's attempt: **hole punching
        fails** (ECONNREFUSED), although the mapping would allow it.
    """

    ENDPOINT_INDEPENDENT = "endpoint-independent"
    SYMMETRIC = "symmetric"
    ENDPOINT_INDEPENDENT_REJECT = "endpoint-independent-reject"

    @property
    def hole_punching(self) -> bool:
        """Whether TCP hole punching through this gateway is expected to work."""
        return self is NatType.ENDPOINT_INDEPENDENT


def nat_ruleset(nat: NatType, *, wan: str = "wan0") -> str:
    """The ``nft -f`` ruleset of a gateway of type ``nat`` whose internet side is ``wan``.

    Loaded into a fresh gateway namespace, where it is the only ruleset.
    """
    randomise = " fully-random" if nat is NatType.SYMMETRIC else ""
    if nat is NatType.ENDPOINT_INDEPENDENT_REJECT:
        unsolicited = (f'        iifname "{wan}" meta l4proto tcp reject with tcp reset\n'
                       f'        iifname "{wan}" reject\n')
    else:
        unsolicited = f'        iifname "{wan}" drop\n'
    return (
        f"table ip {TABLE} {{\n"
        f"    chain postrouting {{\n"
        f"        type nat hook postrouting priority srcnat; policy accept;\n"
        f'        oifname "{wan}" masquerade{randomise}\n'
        f"    }}\n"
        # Packets for the gateway itself: replies to connections it or its
        # hosts opened (conntrack un-NATs them first) pass, the rest do not.
        f"    chain input {{\n"
        f"        type filter hook input priority filter; policy accept;\n"
        f'        iifname "{wan}" ct state established,related accept\n'
        f"{unsolicited}"
        f"    }}\n"
        # Nobody on the internet reaches a private host directly, even with a
        # route to the LAN: only replies are forwarded inwards.
        f"    chain forward {{\n"
        f"        type filter hook forward priority filter; policy accept;\n"
        f'        iifname "{wan}" ct state established,related accept\n'
        f'        iifname "{wan}" drop\n'
        f"    }}\n"
        f"}}\n"
    )
