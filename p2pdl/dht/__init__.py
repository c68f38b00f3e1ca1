"""DHT layer: peer discovery and signed dictionary records (protocols/dht.md, docs/dht.md).

A Kademlia DHT on p2pdl nodes.  A key holds a plain value or a dictionary
of subkeys, each with its own expiration; owned subkeys (``@<peer id>``)
can be written only by their peer.  Every replica and every getter
validates what it sees.  Reach it as ``node.dht``.  Modules:

* ``config`` -- :class:`DHTConfig` (documented defaults) and the wire's hard limits.
* ``_keys`` -- the 256-bit key space (SHA-256 of peer ids and keys), XOR distance.
* ``_routing`` -- :class:`RoutingTable`: k-buckets, replacement cache, refresh keys (sans-IO).
* ``_lookup`` -- :class:`Lookup`: iterative lookups, alpha in flight, k nearest (sans-IO).
* ``_validation`` -- :class:`Schema`, :class:`Validator`, owned subkeys, signatures (sans-IO).
* ``_records`` -- items, the merge rule, :class:`RecordStore` (sans-IO).
* ``_messages`` -- the protocol ``/p2pdl/dht/1.0.0``.
* ``_state`` -- :class:`DHTState`: what a node answers, accepts, republishes,
  and which run a key belongs to; the group records (sans-IO).
* ``_service`` -- :class:`DHTService`: the queries and lookups on the wire,
  store/get, bootstrap, refresh, republish, expiry, groups.
* ``_relays`` -- :class:`RelayDirectory`: when a relay announces itself in the
  DHT, when a node that wants relays looks them up, which it hands to its
  host (sans-IO).
* ``_relaying`` -- :class:`RelayFinder`: the relay directory on trio.

The sans-IO parts also drive the 10,000-peer simulator
(``simulations/dht_scale.py``).  py-libp2p's ``kad_dht`` is not used: its
routing and lookups do I/O inside (so they cannot drive a simulation), its
records have no per-writer subkeys, and ``put_value`` reports nothing on
failure.
"""

from ._keys import KEY_BITS as KEY_BITS
from ._keys import bucket_index as bucket_index
from ._keys import distance as distance
from ._keys import key_of as key_of
from ._lookup import Lookup as Lookup
from ._lookup import LookupStats as LookupStats
from ._messages import DHT_PROTOCOL as DHT_PROTOCOL
from ._messages import DHT_PROTOCOL_ID as DHT_PROTOCOL_ID
from ._records import Item as Item
from ._records import Record as Record
from ._records import RecordStore as RecordStore
from ._routing import Contact as Contact
from ._routing import RoutingTable as RoutingTable
from ._service import DHTService as DHTService
from ._service import DHTStatistics as DHTStatistics
from ._state import GROUP_PREFIX as GROUP_PREFIX
from ._state import GROUP_SCHEMA as GROUP_SCHEMA
from ._state import DHTState as DHTState
from ._state import GroupMember as GroupMember
from ._state import GroupPeer as GroupPeer
from ._state import ValueWithExpiration as ValueWithExpiration
from ._validation import InvalidRecord as InvalidRecord
from ._validation import Schema as Schema
from ._validation import Validator as Validator
from ._validation import owned_subkey as owned_subkey
from ._validation import owner_of as owner_of
from .config import DHTConfig as DHTConfig

