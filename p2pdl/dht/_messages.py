"""Messages of the DHT protocol ``/p2pdl/dht/1.0.0`` (protocols/dht.md)."""

from __future__ import annotations

from typing import Annotated

from ..wire import MaxLen, Message, RpcProtocol
from .config import (
    MAX_ADDR_LENGTH,
    MAX_CLOSER_PEERS,
    MAX_ITEMS,
    MAX_KEY_LENGTH,
    MAX_PEER_ADDRS,
    MAX_SIGNATURE_SIZE,
    MAX_STORE_ITEMS,
    MAX_SUBKEY_LENGTH,
    MAX_VALUE_SIZE,
)

DHT_PROTOCOL_ID = "/p2pdl/dht/1.0.0"

#: Length of a target in the key space (SHA-256).
TARGET_SIZE = 32
#: Bytes of a peer id on the wire, at most.
MAX_PEER_ID_SIZE = 64
#: Characters of a store result, at most.
MAX_RESULT_LENGTH = 200

Addrs = Annotated[tuple[Annotated[str, MaxLen(MAX_ADDR_LENGTH)], ...], MaxLen(MAX_PEER_ADDRS)]


class PeerEntry(Message, tag="dht.peer"):
    """A DHT server: its peer id (binary) and the addresses to dial it at."""

    peer: Annotated[bytes, MaxLen(MAX_PEER_ID_SIZE)]
    addrs: Addrs


class WireItem(Message, tag="dht.item"):
    """One value of a key: the plain value (``subkey`` nil) or one subkey's."""

    subkey: Annotated[str, MaxLen(MAX_SUBKEY_LENGTH)] | None
    value: Annotated[bytes, MaxLen(MAX_VALUE_SIZE)]
    expiration: float
    signature: Annotated[bytes, MaxLen(MAX_SIGNATURE_SIZE)] = b""


class FindNode(Message, tag="dht.find_node"):
    """Which servers do you know nearest to ``target``?"""

    target: Annotated[bytes, MaxLen(TARGET_SIZE)]
    server: bool = False
    addrs: Addrs = ()


class FindValue(Message, tag="dht.find_value"):
    """What do you hold under ``key``, and which servers are nearer to it?"""

    key: Annotated[str, MaxLen(MAX_KEY_LENGTH)]
    server: bool = False
    addrs: Addrs = ()


class Store(Message, tag="dht.store"):
    """Please hold these items of ``key``."""

    key: Annotated[str, MaxLen(MAX_KEY_LENGTH)]
    items: Annotated[list[WireItem], MaxLen(MAX_STORE_ITEMS)]
    server: bool = False
    addrs: Addrs = ()


class Nodes(Message, tag="dht.nodes"):
    closer: Annotated[list[PeerEntry], MaxLen(MAX_CLOSER_PEERS)]
    server: bool = False


class Value(Message, tag="dht.value"):
    items: Annotated[list[WireItem], MaxLen(MAX_ITEMS)]
    closer: Annotated[list[PeerEntry], MaxLen(MAX_CLOSER_PEERS)]
    server: bool = False


class Stored(Message, tag="dht.stored"):
    """One result per item, in order: ``""`` if held, else why not."""

    results: Annotated[list[Annotated[str, MaxLen(MAX_RESULT_LENGTH)]], MaxLen(MAX_STORE_ITEMS)]
    server: bool = False


DHT_PROTOCOL = RpcProtocol.define(DHT_PROTOCOL_ID, [FindNode, FindValue, Store],
                                  [Nodes, Value, Stored])
