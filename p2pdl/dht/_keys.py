"""The Kademlia key space: 256-bit keys, XOR distance, bucket indices.  No I/O.

Peers and records share one space: a peer's key is the SHA-256 of its peer id
bytes, a record's key the SHA-256 of the user's key (as libp2p's Kademlia
does), so a node cannot simply claim a position; it can still generate
identities until one lands near a key (a Sybil attack), which this does not stop.
"""

from __future__ import annotations

import hashlib
import os

KEY_BITS = 256
KEY_BYTES = KEY_BITS // 8


def key_of(data: bytes) -> int:
    """The position of ``data`` (a peer id's bytes, a record key) in the key space."""
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def distance(a: int, b: int) -> int:
    return a ^ b


def bucket_index(local: int, other: int) -> int:
    """Index of the k-bucket of ``other`` seen from ``local``: 255 for the far half.

    Bucket ``i`` holds keys whose distance has its highest set bit at ``i``;
    ``other == local`` has no bucket (-1).
    """
    return (local ^ other).bit_length() - 1


def random_key_in_bucket(local: int, index: int, rng_bytes: bytes | None = None) -> int:
    """A random key whose distance from ``local`` has its top bit at ``index``."""
    noise = int.from_bytes(rng_bytes or os.urandom(KEY_BYTES), "big")
    span = 1 << index
    offset = span | (noise & (span - 1))
    return local ^ offset
