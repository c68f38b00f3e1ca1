"""DHT layer: peer discovery and signed dictionary records (work in progress, issue 4).

So far the sans-IO core, shared by real nodes and the scale simulator
(``simulations/dht_scale.py``):

* ``_keys`` -- the 256-bit key space (SHA-256 of peer ids and record keys), XOR distance.
* ``_routing`` -- :class:`RoutingTable`: k-buckets, replacement cache, refresh keys.
* ``_lookup`` -- :class:`Lookup`: iterative lookups, alpha in flight, k nearest.

py-libp2p's ``kad_dht`` is not used: its routing and lookups do I/O inside
(so they cannot drive a 10,000-peer simulation), its records have no
per-writer subkeys, and ``put_value`` reports nothing on failure.
"""

from ._keys import KEY_BITS as KEY_BITS
from ._keys import bucket_index as bucket_index
from ._keys import distance as distance
from ._keys import key_of as key_of
from ._lookup import Lookup as Lookup
from ._lookup import LookupStats as LookupStats
from ._routing import Contact as Contact
from ._routing import RoutingTable as RoutingTable
