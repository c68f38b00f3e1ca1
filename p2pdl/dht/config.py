"""Settings of the DHT (protocols/dht.md).  Every field has a documented default."""

from __future__ import annotations

import dataclasses
from typing import Literal

from ..errors import ConfigError
from ..net import BackoffPolicy

KiB = 1024

#: Hard limits of the wire protocol, whatever a node's configuration says.
MAX_KEY_LENGTH = 256          # bytes of a key (UTF-8)
MAX_SUBKEY_LENGTH = 256       # bytes of a subkey (UTF-8)
MAX_VALUE_SIZE = 64 * KiB     # bytes of one encoded value
MAX_SIGNATURE_SIZE = 128      # bytes of a signature (ed25519 uses 64)
MAX_ITEMS = 1024              # items of one record in one message
MAX_STORE_ITEMS = 64          # items of one store request
STORE_BATCH_BYTES = 256 * KiB  # a sender splits larger stores into several requests
MAX_CLOSER_PEERS = 32         # contacts in one answer
MAX_PEER_ADDRS = 8            # addresses of one contact
MAX_ADDR_LENGTH = 256         # characters of one address
MAX_RECORD_SIZE = 512 * KiB   # bytes of one key's values, so that an answer fits a message


@dataclasses.dataclass(frozen=True)
class DHTConfig:
    """How a node takes part in the DHT.

    Attributes:
        mode: ``"auto"`` (default): a DHT server while the node is publicly
            reachable, a client otherwise; ``"server"`` or ``"client"``
            force it.  Clients look up and store but are never put in other
            nodes' routing tables (their requests say so).
        k: bucket size and lookup width (Kademlia's k): a lookup ends when
            the k nearest peers it found have answered.  Default 20.
        alpha: queries in flight per lookup while it still finds nearer
            peers (once an answer brings none, a lookup that must reach the
            k nearest asks all of them not yet asked at once; a get that stops
            at the first value stays alpha wide).  Default 3.
        replication: nodes each record is stored on (the nearest to its key).
            Default 20 (= k).
        store_quorum: a store returns once this many of its replicas hold
            the record (or every replica answered); the others are sent to in
            the background, within the store's ``operation_timeout``, so one
            slow replica delays no caller.  Default 5 (at most
            ``replication``).
        query_timeout: longest wait for one peer's answer during a lookup or
            a store.  Default 5 s.
        operation_timeout: longest a whole store or get may take.  Default 30 s.
        max_lookup_queries: queries one lookup may send at most.  Default 160.
        refresh_interval: a routing-table bucket no lookup went through for
            this long is refreshed by a lookup of a random key in it.
            Default 600 s.
        bootstrap_backoff: delays between bootstrap attempts while the
            routing table is empty or small (a new connection while it is
            empty triggers an attempt at once).  Default 1 s doubling to 30 s.
        republish_interval: how often a node re-stores records it published
            itself (as long as they have not expired), and re-sends the
            records it holds for others to the current nearest nodes (skipped
            for records stored to it more recently).  Default 300 s.
        max_published: records a node remembers for republishing.  Default 1024.
        max_ttl: a record's expiration may lie at most this far ahead of the
            receiver's clock.  Default 86400 s (one day).
        max_value_size: largest encoded value of one record or subkey.
            Default 16 KiB (the wire allows 64 KiB).
        max_record_size: largest total size of one key: value, signature and
            subkey bytes of every item held, a hidden plain value included.
            Default 256 KiB (the wire allows 512 KiB, so that an answer
            carrying a whole key fits one message).
        max_subkeys: subkeys one key may hold.  Default 1024.
        max_keys: keys a node stores for others at most.  Default 10,000.
        max_storage_bytes: bytes a node stores for the DHT at most (value,
            signature and subkey bytes of every item).  Default 64 MiB.
        relay_directory: relays found through the DHT (protocols/dht.md,
            The relay directory).  A node that serves circuit relay v2
            (``HostConfig.relay_service``) and is publicly reachable
            announces itself in the group ``RELAYS_GROUP``; a node that wants
            relays (not known to be public) looks the group up and hands the
            relays found, at most MAX_RELAY_CANDIDATES a lookup and
            MAX_RELAYS_HANDED in all, to its host as reservation candidates
            beside its initial peers.  Default True.
        relay_ttl: lifetime of a relay's entry; it is announced again once
            half of it has passed.  Default 600 s.
        relay_lookup_interval: how often a node that wants relays and holds
            fewer reservations than ``HostConfig.relay_reservations`` looks
            the group up again.  Default 60 s.
    """

    mode: Literal["auto", "server", "client"] = "auto"
    k: int = 20
    alpha: int = 3
    replication: int = 20
    store_quorum: int = 5
    query_timeout: float = 5.0
    operation_timeout: float = 30.0
    max_lookup_queries: int = 160
    refresh_interval: float = 600.0
    bootstrap_backoff: BackoffPolicy = BackoffPolicy(initial=1.0, maximum=30.0)
    republish_interval: float = 300.0
    max_published: int = 1024
    max_ttl: float = 86400.0
    max_value_size: int = 16 * KiB
    max_record_size: int = 256 * KiB
    max_subkeys: int = 1024
    max_keys: int = 10_000
    max_storage_bytes: int = 64 * 1024 * KiB
    relay_directory: bool = True
    relay_ttl: float = 600.0
    relay_lookup_interval: float = 60.0

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"DHTConfig: {what}")

        check(self.mode in ("auto", "server", "client"),
              f"mode must be 'auto', 'server' or 'client', not {self.mode!r}")
        check(1 <= self.k <= MAX_CLOSER_PEERS, f"k must be in 1..{MAX_CLOSER_PEERS}")
        check(1 <= self.alpha <= self.k, "alpha must be in 1..k")
        check(1 <= self.replication <= MAX_CLOSER_PEERS,
              f"replication must be in 1..{MAX_CLOSER_PEERS}")
        check(1 <= self.store_quorum, "store_quorum must be at least 1")
        for name in ("query_timeout", "operation_timeout", "refresh_interval",
                     "republish_interval", "max_ttl", "relay_ttl", "relay_lookup_interval"):
            check(getattr(self, name) > 0, f"{name} must be positive")
        check(1 <= self.max_value_size <= MAX_VALUE_SIZE,
              f"max_value_size must be in 1..{MAX_VALUE_SIZE}")
        check(self.max_value_size <= self.max_record_size <= MAX_RECORD_SIZE,
              f"max_record_size must be in max_value_size..{MAX_RECORD_SIZE}")
        check(1 <= self.max_subkeys <= MAX_ITEMS, f"max_subkeys must be in 1..{MAX_ITEMS}")
        for name in ("max_lookup_queries", "max_published", "max_keys", "max_storage_bytes"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1")
