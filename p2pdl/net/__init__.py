"""Host layer: the py-libp2p host every other layer runs on.

Modules:

* ``config`` -- :class:`HostConfig`, :class:`RelayLimits`, :class:`BackoffPolicy` (defaults).
* ``_build`` -- :func:`open_host`: py-libp2p with TCP + Noise + Yamux only, and its relays.
* ``_host`` -- :class:`Host`, the facade the layers above use, composed of the five below.
* ``_paths`` -- connections, and how each peer is reached (direct, hole-punched, relayed).
* ``_dcutr`` -- DCUtR that tells ``_paths`` which direct connections it hole-punched.
* ``_dialer`` -- dialling (direct, then circuits), known addresses, initial peers, streams.
* ``_reservations`` -- circuit relay reservations held on relays, carried out on trio.
* ``_inbound`` -- every incoming stream: bounded per peer, timed, its errors counted and contained.
* ``_memory`` -- memory freed after bursts of input given back to the system (glibc).
* ``_budget`` -- the input budget: bytes peers sent that the node holds, per peer and in all.
* ``_interop`` -- patch: relayed connections' addresses, as identify reports them.
* ``_hardening`` -- patches: multistream-select and Yamux input checked, remote errors logged low.
* ``_relay`` -- the reservation book (sans-IO) and circuit address helpers.
* ``_identity`` -- the persistent ed25519 identity file.
* ``_addrs`` -- parsing of peer ids and multiaddrs given by users; unspecified addresses kept out.
* ``_backoff`` -- retry delays (sans-IO).
* ``_ping`` -- the standard libp2p ping as a client (``/ipfs/ping/1.0.0``).
* ``_yamux`` -- patch: Yamux frame writes made whole under cancellation.
* ``_fastpath`` -- patch: py-libp2p's bulk data path made cheaper per byte; ``read_owned``.
"""

from ._addrs import PeerIDLike as PeerIDLike
from ._addrs import parse_multiaddr as parse_multiaddr
from ._addrs import parse_peer_addr as parse_peer_addr
from ._addrs import parse_peer_id as parse_peer_id
from ._backoff import Backoff as Backoff
from ._budget import InputBudget as InputBudget
from ._budget import input_budget as input_budget
from ._build import MUXER_PROTOCOLS as MUXER_PROTOCOLS
from ._build import SECURITY_PROTOCOLS as SECURITY_PROTOCOLS
from ._build import open_host as open_host
from ._fastpath import read_owned as read_owned
from ._host import Host as Host
from ._host import HostStatistics as HostStatistics
from ._identity import load_identity as load_identity
from ._identity import load_or_create_identity as load_or_create_identity
from ._inbound import InboundStatistics as InboundStatistics
from ._ping import LIBP2P_PING_PROTOCOL_ID as LIBP2P_PING_PROTOCOL_ID
from ._ping import ping_libp2p as ping_libp2p
from .config import BackoffPolicy as BackoffPolicy
from .config import HostConfig as HostConfig
from .config import RelayLimits as RelayLimits
