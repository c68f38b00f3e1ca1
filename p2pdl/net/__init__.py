"""Host layer: the py-libp2p host every other layer runs on.

Modules:

* ``config`` -- :class:`HostConfig` and :class:`BackoffPolicy`, documented defaults.
* ``_host`` -- :func:`open_host` and :class:`Host`: TCP + Noise + Yamux only,
  connection reuse, initial peers with retries and backoff, error mapping.
* ``_identity`` -- the persistent ed25519 identity file.
* ``_addrs`` -- parsing of peer ids and multiaddrs given by users.
* ``_backoff`` -- retry delays (sans-IO).
* ``_ping`` -- the standard libp2p ping as a client (``/ipfs/ping/1.0.0``).
"""

from ._addrs import PeerIDLike as PeerIDLike
from ._addrs import parse_multiaddr as parse_multiaddr
from ._addrs import parse_peer_addr as parse_peer_addr
from ._addrs import parse_peer_id as parse_peer_id
from ._backoff import Backoff as Backoff
from ._host import MUXER_PROTOCOLS as MUXER_PROTOCOLS
from ._host import SECURITY_PROTOCOLS as SECURITY_PROTOCOLS
from ._host import Host as Host
from ._host import open_host as open_host
from ._identity import load_identity as load_identity
from ._identity import load_or_create_identity as load_or_create_identity
from ._ping import LIBP2P_PING_PROTOCOL_ID as LIBP2P_PING_PROTOCOL_ID
from ._ping import ping_libp2p as ping_libp2p
from .config import BackoffPolicy as BackoffPolicy
from .config import HostConfig as HostConfig
from .config import RelayLimits as RelayLimits
