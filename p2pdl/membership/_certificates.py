"""Membership certificates, revocation lists and the run authority that signs them.  No I/O
but the files users keep.

A run authority is an ed25519 key; its id is the libp2p peer id of that key
(base58, ``12D3KooW...``), so the id alone is enough to check a signature and
a certificate signed by another key names another authority.  A
:class:`Certificate` binds a run id, a peer id, a role, a validity window and
a serial; a :class:`RevocationList` names the serials of one run that are
revoked, with a sequence number (the highest valid one wins).

Both are signed over a domain-separated msgpack array of every field (the
signing payloads below) and travel as a msgpack array of the same fields plus
the signature.  Decoding is strict: exact types, bounded sizes, the right
number of fields; anything else is a :class:`~p2pdl.errors.RemoteProtocolError`.
Files are a header line and the encoded bytes in base64, so that a user can
mail them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import os
import pathlib
import secrets
import stat
import time
from collections.abc import Iterable
from typing import Any

import msgpack
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair, KeyType, PublicKey
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.peer.id import ID

from ..errors import ConfigError, IdentityError, RemoteProtocolError
from ..service import Role, run_id_problem
from .config import (
    DEFAULT_CERTIFICATE_LIFETIME,
    MAX_CERTIFICATE_SIZE,
    MAX_FILE_SIZE,
    MAX_PEER_ID_LENGTH,
    MAX_REVOCATION_LIST_SIZE,
    MAX_REVOKED_SERIALS,
    MAX_SEQUENCE,
    MAX_SERIAL,
    MAX_SIGNATURE_SIZE,
)

__all__ = ["Certificate", "RevocationList", "Authority", "CERTIFICATE_DOMAIN",
           "REVOCATION_DOMAIN", "FORMAT_VERSION", "CERTIFICATE_HEADER", "REVOCATION_HEADER",
           "AUTHORITY_KEY_FILE", "AUTHORITY_ID_FILE", "peer_id_problem"]

#: Domains of the two signatures: a signature of one kind never verifies as the other.
CERTIFICATE_DOMAIN = "p2pdl/membership/certificate/1"
REVOCATION_DOMAIN = "p2pdl/membership/revocations/1"
#: The first element of every encoded certificate and revocation list.
FORMAT_VERSION = 1
#: First lines of the files.
CERTIFICATE_HEADER = "p2pdl membership certificate v1"
REVOCATION_HEADER = "p2pdl revocation list v1"
#: Names of the files ``Authority.save`` writes.
AUTHORITY_KEY_FILE = "authority.key"
AUTHORITY_ID_FILE = "authority.id"
#: Largest authority key file (a libp2p protobuf private key is ~70 bytes).
MAX_KEY_FILE = 4096

_ROLES = {role.value: role for role in Role}


def peer_id_problem(text: object) -> str | None:
    """Why ``text`` is not a base58 peer id whose public key can be read, or None."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_PEER_ID_LENGTH:
        return "a peer id must be a base58 string of at most " \
               f"{MAX_PEER_ID_LENGTH} characters"
    try:
        key = ID.from_base58(text).extract_public_key()
    except Exception:  # base58 / multihash decoding of untrusted text
        return f"{text[:60]!r} is not a peer id"
    if key is None or key.get_type() != KeyType.Ed25519:
        return f"{text[:60]!r} does not embed an ed25519 public key"
    return None


def _public_key(peer_id: str) -> PublicKey | None:
    try:
        return ID.from_base58(peer_id).extract_public_key()
    except Exception:  # untrusted text
        return None


def _peer_text(peer: ID | str) -> str:
    return peer.to_base58() if isinstance(peer, ID) else str(peer)


def _unpack(data: object, limit: int, what: str) -> list[Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RemoteProtocolError(f"a {what} is bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > limit:
        raise RemoteProtocolError(f"a {what} of {len(data)} bytes; at most {limit}")
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                                max_array_len=MAX_REVOKED_SERIALS,
                                max_map_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several types on junk
        raise RemoteProtocolError(f"a {what} that is not msgpack: {type(exc).__name__}") from None
    if not isinstance(value, list):
        raise RemoteProtocolError(f"a {what} is a msgpack array, not {type(value).__name__}")
    return value


def _check(condition: bool, what: str, detail: str) -> None:
    if not condition:
        raise RemoteProtocolError(f"bad {what}: {detail}")


def _is_int(value: object, high: int) -> bool:
    return type(value) is int and 0 <= value <= high


def _is_time(value: object) -> bool:
    return type(value) is float and math.isfinite(value) and value >= 0


def _write_text(path: str | os.PathLike[str], header: str, data: bytes) -> pathlib.Path:
    path = pathlib.Path(path)
    body = base64.b64encode(data).decode("ascii")
    lines = [body[i:i + 76] for i in range(0, len(body), 76)]
    path.write_text("\n".join([header, *lines]) + "\n", encoding="ascii")
    return path


def _read_text(path: str | os.PathLike[str], header: str, what: str) -> bytes:
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_SIZE + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if len(raw) > MAX_FILE_SIZE:
        raise ConfigError(f"{path} is too large to be a {what} file")
    try:
        text = raw.decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a {what} file (not ASCII text)") from None
    if not text or text[0].strip() != header:
        raise ConfigError(f"{path} is not a {what} file (its first line is not {header!r})")
    lines = [line.strip() for line in text[1:] if line.strip()]
    try:
        return base64.b64decode("".join(lines), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{path}: the {what} is not valid base64") from None


def _from_file(cls: Any, path: str | os.PathLike[str], header: str, what: str) -> Any:
    data = _read_text(path, header, what)
    try:
        return cls.from_bytes(data)
    except RemoteProtocolError as exc:
        raise ConfigError(f"{path}: not a valid {what}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Certificate:
    """A run authority's statement: ``peer_id`` is a member of ``run_id`` in ``role``,
    from ``issued_at`` until ``expires_at`` (wall-clock seconds).

    Obtain one from :meth:`Authority.issue`, :meth:`from_bytes` or :meth:`load`;
    check it with :meth:`problem`.  ``authority`` is the signer's id (base58
    peer id of its key); ``serial`` names the certificate in revocation lists.
    """

    run_id: str
    peer_id: str
    role: Role
    issued_at: float
    expires_at: float
    serial: int
    authority: str
    signature: bytes

    def signing_payload(self) -> bytes:
        """The bytes the authority signs: the domain and every field but the signature."""
        return msgpack.packb([CERTIFICATE_DOMAIN, FORMAT_VERSION, self.run_id, self.peer_id,
                              self.role.value, float(self.issued_at), float(self.expires_at),
                              self.serial, self.authority], use_bin_type=True)

    def to_bytes(self) -> bytes:
        return msgpack.packb([FORMAT_VERSION, self.run_id, self.peer_id, self.role.value,
                              float(self.issued_at), float(self.expires_at), self.serial,
                              self.authority, self.signature], use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> Certificate:
        """Decode a certificate (it is not verified: see :meth:`problem`).

        Raises :class:`~p2pdl.errors.RemoteProtocolError` (a ``ValueError``
        too is never raised for other reasons) for anything but a well-formed one.
        """
        fields = _unpack(data, MAX_CERTIFICATE_SIZE, "certificate")
        what = "certificate"
        _check(len(fields) == 9, what, f"{len(fields)} fields; expected 9")
        version, run_id, peer_id, role, issued_at, expires_at, serial, authority, sig = fields
        _check(version == FORMAT_VERSION and type(version) is int, what,
               f"format {version!r}; this node reads {FORMAT_VERSION}")
        _check(run_id_problem(run_id) is None, what, "bad run id")
        _check(isinstance(peer_id, str) and len(peer_id) <= MAX_PEER_ID_LENGTH, what,
               "bad peer id")
        _check(isinstance(role, str) and role in _ROLES, what, f"unknown role {role!r:.40}")
        _check(_is_time(issued_at) and _is_time(expires_at), what, "bad times")
        _check(_is_int(serial, MAX_SERIAL), what, "bad serial")
        _check(isinstance(authority, str) and len(authority) <= MAX_PEER_ID_LENGTH, what,
               "bad authority id")
        _check(isinstance(sig, bytes) and len(sig) <= MAX_SIGNATURE_SIZE, what, "bad signature")
        return cls(run_id, peer_id, _ROLES[role], issued_at, expires_at, serial, authority, sig)

    def problem(self, authority_id: str, run_id: str, peer_id: ID | str, now: float,
                skew: float = 0.0) -> str | None:
        """Why this certificate does not admit ``peer_id`` to ``run_id`` under
        ``authority_id`` at ``now`` (with ``skew`` seconds of clock difference
        allowed either way), or None when it does.  Revocation is not checked
        here (the run's revocation list is)."""
        if self.authority != authority_id:
            return "signed by another authority"
        if self.run_id != run_id:
            return "for another run"
        if self.peer_id != _peer_text(peer_id):
            return "for another peer"
        key = _public_key(self.authority)
        try:
            valid = key is not None and key.verify(self.signing_payload(), self.signature)
        except Exception:  # a malformed signature
            valid = False
        if not valid:
            return "bad signature"
        if self.issued_at > now + skew:
            return "not valid yet"
        if now >= self.expires_at + skew:
            return "expired"
        return None

    def save(self, path: str | os.PathLike[str]) -> pathlib.Path:
        """Write the certificate to ``path`` (a header line and base64; not secret)."""
        return _write_text(path, CERTIFICATE_HEADER, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Certificate:
        """Read a certificate file.  Raises :class:`~p2pdl.errors.ConfigError` with the reason."""
        return _from_file(cls, path, CERTIFICATE_HEADER, "membership certificate")


@dataclasses.dataclass(frozen=True)
class RevocationList:
    """The serials of ``run_id``'s certificates that ``authority`` revoked, as of
    ``sequence`` (higher sequences replace lower ones) and ``issued_at``."""

    run_id: str
    authority: str
    sequence: int
    issued_at: float
    serials: frozenset[int]
    signature: bytes

    def _sorted(self) -> list[int]:
        return sorted(self.serials)

    def signing_payload(self) -> bytes:
        return msgpack.packb([REVOCATION_DOMAIN, FORMAT_VERSION, self.run_id, self.authority,
                              self.sequence, float(self.issued_at), self._sorted()],
                             use_bin_type=True)

    def to_bytes(self) -> bytes:
        return msgpack.packb([FORMAT_VERSION, self.run_id, self.authority, self.sequence,
                              float(self.issued_at), self._sorted(), self.signature],
                             use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> RevocationList:
        """Decode a revocation list (not verified: see :meth:`problem`); strict as
        :meth:`Certificate.from_bytes`."""
        fields = _unpack(data, MAX_REVOCATION_LIST_SIZE, "revocation list")
        what = "revocation list"
        _check(len(fields) == 7, what, f"{len(fields)} fields; expected 7")
        version, run_id, authority, sequence, issued_at, serials, sig = fields
        _check(version == FORMAT_VERSION and type(version) is int, what,
               f"format {version!r}; this node reads {FORMAT_VERSION}")
        _check(run_id_problem(run_id) is None, what, "bad run id")
        _check(isinstance(authority, str) and len(authority) <= MAX_PEER_ID_LENGTH, what,
               "bad authority id")
        _check(_is_int(sequence, MAX_SEQUENCE), what, "bad sequence")
        _check(_is_time(issued_at), what, "bad time")
        _check(isinstance(serials, list) and len(serials) <= MAX_REVOKED_SERIALS
               and all(_is_int(s, MAX_SERIAL) for s in serials), what, "bad serials")
        _check(serials == sorted(set(serials)), what, "serials not sorted and distinct")
        _check(isinstance(sig, bytes) and len(sig) <= MAX_SIGNATURE_SIZE, what, "bad signature")
        return cls(run_id, authority, sequence, issued_at, frozenset(serials), sig)

    def problem(self, authority_id: str, run_id: str, now: float,
                skew: float = 0.0) -> str | None:
        """Why this list is not ``authority_id``'s word on ``run_id``, or None."""
        if self.authority != authority_id:
            return "signed by another authority"
        if self.run_id != run_id:
            return "for another run"
        key = _public_key(self.authority)
        try:
            valid = key is not None and key.verify(self.signing_payload(), self.signature)
        except Exception:  # a malformed signature
            valid = False
        if not valid:
            return "bad signature"
        if self.issued_at > now + skew:
            return "issued in the future"
        return None

    def save(self, path: str | os.PathLike[str]) -> pathlib.Path:
        return _write_text(path, REVOCATION_HEADER, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RevocationList:
        """Read a revocation list file.  Raises :class:`~p2pdl.errors.ConfigError`."""
        return _from_file(cls, path, REVOCATION_HEADER, "revocation list")


class Authority:
    """A run authority: the ed25519 key that signs a run's certificates and revocations.

    ``Authority.generate()`` makes one; :meth:`save` writes its private key
    (mode 0600) and its public id; :meth:`load` reads the key back.  Keep the
    key file off the training machines: only :attr:`id` is needed to check.
    """

    def __init__(self, key_pair: KeyPair) -> None:
        if key_pair.private_key.get_type() != KeyType.Ed25519:
            raise ConfigError("a run authority key must be an ed25519 key")
        self._key_pair = key_pair
        self._id = ID.from_pubkey(key_pair.public_key).to_base58()

    @classmethod
    def generate(cls) -> Authority:
        return cls(create_new_key_pair())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Authority:
        """Read an authority key file (``authority.key``, or the directory holding it).

        Raises :class:`~p2pdl.errors.IdentityError` for a file that is not an
        ed25519 key; warns nothing, but refuses nothing, for loose permissions.
        """
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / AUTHORITY_KEY_FILE
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_KEY_FILE + 1)
        except OSError as exc:
            raise IdentityError(f"cannot read the authority key {path}: {exc.strerror}") from None
        try:
            if len(data) > MAX_KEY_FILE:
                raise ValueError("too large")
            private_key = deserialize_private_key(data)
        except Exception:
            raise IdentityError(f"{path} is not a libp2p private key file") from None
        if private_key.get_type() != KeyType.Ed25519:
            raise IdentityError(f"{path} holds a {private_key.get_type().name} key; "
                                f"authorities use ed25519 keys")
        return cls(KeyPair(private_key, private_key.get_public_key()))

    def save(self, directory: str | os.PathLike[str]) -> pathlib.Path:
        """Write ``authority.key`` (the private key, mode 0600) and ``authority.id``
        (the public id, one line) into ``directory`` (created if missing).

        Never overwrites a key: raises :class:`~p2pdl.errors.ConfigError` if
        ``authority.key`` exists.  Returns the key file's path.
        """
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / AUTHORITY_KEY_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise ConfigError(f"{path} already exists; it was left untouched") from None
        try:
            os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
            os.write(fd, self._key_pair.private_key.serialize())
            os.fsync(fd)
        finally:
            os.close(fd)
        (directory / AUTHORITY_ID_FILE).write_text(self._id + "\n", encoding="ascii")
        return path

    @property
    def id(self) -> str:
        """The authority's public id: the base58 peer id of its key (what members configure)."""
        return self._id

    def issue(self, run_id: str, peer_id: ID | str, role: Role | str = Role.TRAINER, *,
              expires_at: float | None = None, expires_in: float | None = None,
              serial: int | None = None, now: float | None = None) -> Certificate:
        """A certificate admitting ``peer_id`` to ``run_id`` in ``role``.

        It is valid from ``now`` (default: the wall clock) until ``expires_at``,
        or ``now + expires_in``, or ``now`` plus DEFAULT_CERTIFICATE_LIFETIME
        (30 days).  ``serial`` (default random) is what a revocation names.
        """
        problem = run_id_problem(run_id)
        if problem:
            raise ConfigError(problem)
        peer_text = _peer_text(peer_id)
        problem = peer_id_problem(peer_text)
        if problem:
            raise ConfigError(problem)
        if isinstance(role, str):
            if role not in _ROLES:
                raise ConfigError(f"role must be one of {', '.join(_ROLES)}, not {role!r}")
            role = _ROLES[role]
        if not isinstance(role, Role):
            raise ConfigError(f"role must be a Role, not {role!r}")
        now = time.time() if now is None else float(now)
        if expires_at is not None and expires_in is not None:
            raise ConfigError("give expires_at or expires_in, not both")
        end = (now + (DEFAULT_CERTIFICATE_LIFETIME if expires_in is None else float(expires_in))
               if expires_at is None else float(expires_at))
        if not (math.isfinite(now) and math.isfinite(end) and 0 <= now < end):
            raise ConfigError(f"a certificate must expire after it is issued "
                              f"(issued {now}, expires {end})")
        serial = secrets.randbits(63) if serial is None else serial
        if not _is_int(serial, MAX_SERIAL):
            raise ConfigError(f"serial must be an integer in [0, {MAX_SERIAL}]")
        unsigned = Certificate(run_id, peer_text, role, now, end, serial, self._id, b"")
        signature = self._key_pair.private_key.sign(unsigned.signing_payload())
        return dataclasses.replace(unsigned, signature=signature)

    def revocation_list(self, run_id: str, serials: Iterable[int], *, sequence: int,
                        now: float | None = None) -> RevocationList:
        """A signed list revoking ``serials`` of ``run_id``.  Each list replaces
        the lists of lower ``sequence``, so name every serial still revoked."""
        problem = run_id_problem(run_id)
        if problem:
            raise ConfigError(problem)
        revoked = frozenset(serials)
        if len(revoked) > MAX_REVOKED_SERIALS or not all(_is_int(s, MAX_SERIAL) for s in revoked):
            raise ConfigError(f"a revocation list names at most {MAX_REVOKED_SERIALS} serials, "
                              f"each an integer in [0, {MAX_SERIAL}]")
        if not _is_int(sequence, MAX_SEQUENCE):
            raise ConfigError(f"sequence must be an integer in [0, {MAX_SEQUENCE}]")
        now = time.time() if now is None else float(now)
        unsigned = RevocationList(run_id, self._id, sequence, now, revoked, b"")
        signature = self._key_pair.private_key.sign(unsigned.signing_payload())
        return dataclasses.replace(unsigned, signature=signature)

    def __repr__(self) -> str:
        return f"Authority({self._id})"
