"""What a DHT record may contain: limits, owned (signed) subkeys, schemas.  No I/O.

Every replica checks every item it is asked to store, and every getter
checks every item it receives, with the same :class:`Validator`; so a record
that one honest node rejects is rejected by all of them.

Owned subkeys: a subkey ``"@<peer id>"`` or ``"@<peer id>/<name>"`` belongs
to that peer.  Its value carries an ed25519 signature by the peer's key over
the key, the subkey, the value and the expiration; a write by anyone else,
or a signature that does not verify, is rejected.  p2pdl peer ids embed
their public key, so no key has to travel with the record.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from ..errors import LocalProtocolError, RemoteProtocolError
from ..wire import Message
from .config import MAX_KEY_LENGTH, MAX_SUBKEY_LENGTH, DHTConfig

__all__ = ["Schema", "Validator", "InvalidRecord", "owned_subkey", "owner_of",
           "signing_payload", "encode_value"]

OWNER_MARK = "@"
SIGNATURE_DOMAIN = "p2pdl/dht/record/1"


class InvalidRecord(Exception):
    """An item breaks a rule; ``reason`` is a short code, ``detail`` says more."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class Schema:
    """Rules for every key starting with ``prefix`` (the longest matching prefix wins).

    Attributes:
        prefix: the key prefix, e.g. ``"my-run/progress"``.
        value_type: values must be this :class:`~p2pdl.wire.Message` type
            (checked field by field); ``get`` returns them as such objects.
            None: any msgpack value.
        dictionary: True -- only subkeys may be stored under the key; False --
            only plain values; None -- either.
        signed_subkeys: every subkey must be owned (``@<peer id>...``) and
            signed by its owner.
    """

    prefix: str
    value_type: type[Message] | None = None
    dictionary: bool | None = None
    signed_subkeys: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise LocalProtocolError("Schema.prefix must be a non-empty string")
        if self.value_type is not None and not (isinstance(self.value_type, type)
                                                and issubclass(self.value_type, Message)):
            raise LocalProtocolError("Schema.value_type must be a p2pdl.wire.Message subclass")
        if self.signed_subkeys and self.dictionary is False:
            raise LocalProtocolError("a schema with signed subkeys must allow subkeys")


def owned_subkey(peer_id: ID, name: str = "") -> str:
    """The subkey owned by ``peer_id`` (``@<peer id>`` or ``@<peer id>/<name>``)."""
    return f"{OWNER_MARK}{peer_id.to_base58()}" + (f"/{name}" if name else "")


def owner_of(subkey: str | None) -> ID | None:
    """The owner of an owned subkey; None for an ordinary one.

    Raises :class:`InvalidRecord` for a subkey that starts with ``@`` but
    does not name a peer whose key can be read from its id.
    """
    if not subkey or not subkey.startswith(OWNER_MARK):
        return None
    text = subkey[1:].split("/", 1)[0]
    try:
        peer = ID.from_base58(text)
    except Exception:  # base58 or multihash decoding of untrusted text
        raise InvalidRecord("bad_owner", f"{text[:60]!r} is not a peer id") from None
    if peer.extract_public_key() is None:
        raise InvalidRecord("bad_owner", "the owner's public key cannot be read from its id")
    return peer


def signing_payload(key: str, subkey: str | None, value: bytes, expiration: float) -> bytes:
    """The bytes an owner signs: domain, key, subkey, value and expiration."""
    return msgpack.packb([SIGNATURE_DOMAIN, key, subkey, value, float(expiration)],
                         use_bin_type=True)


def sign(private_key: PrivateKey, key: str, subkey: str | None, value: bytes,
         expiration: float) -> bytes:
    return private_key.sign(signing_payload(key, subkey, value, expiration))


def encode_value(value: Any) -> bytes:
    """msgpack bytes of a user value (a Message is encoded as its fields)."""
    def default(obj: Any) -> Any:
        if isinstance(obj, Message):
            return obj.to_wire()
        raise TypeError(f"a DHT value cannot contain a {type(obj).__name__}")

    try:
        return msgpack.packb(value.to_wire() if isinstance(value, Message) else value,
                             default=default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"cannot encode the DHT value: {exc}") from None


def _unpack(value: bytes) -> Any:
    return msgpack.unpackb(value, raw=False, strict_map_key=False, use_list=True, timestamp=0)


class Validator:
    """Checks items against the limits of ``config`` and the registered schemas."""

    def __init__(self, config: DHTConfig, schemas: tuple[Schema, ...] = ()) -> None:
        self._config = config
        self._schemas: dict[str, Schema] = {}
        for schema in schemas:
            self.register(schema)

    def register(self, schema: Schema) -> None:
        """Add (or replace) the rules for ``schema.prefix``."""
        self._schemas[schema.prefix] = schema

    @property
    def schemas(self) -> tuple[Schema, ...]:
        return tuple(self._schemas.values())

    def schema_for(self, key: str) -> Schema | None:
        best = None
        for prefix, schema in self._schemas.items():
            if key.startswith(prefix) and (best is None or len(prefix) > len(best.prefix)):
                best = schema
        return best

    @staticmethod
    def check_key(key: str) -> None:
        size = len(key.encode())
        if not 0 < size <= MAX_KEY_LENGTH:
            raise InvalidRecord("bad_key", f"a key must have 1..{MAX_KEY_LENGTH} bytes, "
                                           f"not {size}")

    def check(self, key: str, subkey: str | None, value: bytes, expiration: float,
              signature: bytes, now: float) -> None:
        """Raise :class:`InvalidRecord` unless the item may be stored at ``now``."""
        config = self._config
        self.check_key(key)
        if subkey is not None and not 0 < len(subkey.encode()) <= MAX_SUBKEY_LENGTH:
            raise InvalidRecord("bad_subkey", f"a subkey must have 1..{MAX_SUBKEY_LENGTH} bytes")
        if not math.isfinite(expiration) or expiration <= now:
            raise InvalidRecord("expired", f"expiration {expiration:.3f} is not after "
                                           f"now ({now:.3f})")
        if expiration > now + config.max_ttl:
            raise InvalidRecord("too_far_ahead", f"expiration is {expiration - now:.0f} s "
                                                 f"ahead; at most {config.max_ttl:.0f} s")
        if len(value) > config.max_value_size:
            raise InvalidRecord("too_large", f"value of {len(value)} bytes; at most "
                                             f"{config.max_value_size}")
        try:
            decoded = _unpack(value)
        except Exception:  # untrusted bytes: any decoder failure means malformed
            raise InvalidRecord("bad_value", "the value is not msgpack") from None
        schema = self.schema_for(key)
        owner = owner_of(subkey)
        if owner is not None:
            public_key = owner.extract_public_key()
            assert public_key is not None  # owner_of checked it
            try:
                ok = public_key.verify(signing_payload(key, subkey, value, expiration), signature)
            except Exception:  # a malformed signature
                ok = False
            if not ok:
                raise InvalidRecord("bad_signature",
                                    f"subkey {subkey[:60]!r} is not signed by its owner")
        elif signature:
            raise InvalidRecord("bad_signature", "only owned subkeys carry a signature")
        if schema is None:
            return
        if schema.dictionary is True and subkey is None:
            raise InvalidRecord("schema", f"keys under {schema.prefix!r} hold subkeys only")
        if schema.dictionary is False and subkey is not None:
            raise InvalidRecord("schema", f"keys under {schema.prefix!r} hold no subkeys")
        if schema.signed_subkeys and owner is None:
            raise InvalidRecord("schema", f"subkeys under {schema.prefix!r} must be owned "
                                          f"(@<peer id>) and signed")
        if schema.value_type is not None:
            try:
                schema.value_type.from_wire(decoded)
            except RemoteProtocolError as exc:
                raise InvalidRecord("schema", str(exc)) from None

    def decode(self, key: str, value: bytes) -> Any:
        """The user's value: a schema's Message, or the msgpack object."""
        decoded = _unpack(value)
        schema = self.schema_for(key)
        if schema is not None and schema.value_type is not None:
            return schema.value_type.from_wire(decoded)
        return decoded
