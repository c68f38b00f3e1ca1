"""The node's persistent ed25519 identity.

The file holds the private key in libp2p's protobuf key format (as go-libp2p
and rust-libp2p write it).  It is created with mode 0600 and published by an
atomic link, so two processes starting at once agree on one identity.  A file
that cannot be read or parsed is an :class:`IdentityError` and is left as it
is: replacing it would silently change the peer id.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair, KeyType
from libp2p.crypto.serialization import deserialize_private_key

from ..errors import IdentityError

logger = logging.getLogger(__name__)

MAX_IDENTITY_FILE = 4096


def load_identity(path: str | os.PathLike[str]) -> KeyPair:
    """Read an ed25519 identity.  Raises :class:`IdentityError` with the reason."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(MAX_IDENTITY_FILE + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise IdentityError(f"cannot read identity file {path}: {exc.strerror}") from None
    if len(data) > MAX_IDENTITY_FILE:
        raise IdentityError(f"identity file {path} is too large to be a key; "
                            f"it was left untouched")
    try:
        private_key = deserialize_private_key(data)
    except Exception:
        raise IdentityError(f"identity file {path} is corrupt (not a libp2p private key); "
                            f"it was left untouched -- move it away to create a new identity"
                            ) from None
    if private_key.get_type() != KeyType.Ed25519:
        raise IdentityError(f"identity file {path} holds a {private_key.get_type().name} "
                            f"key; p2pdl uses ed25519 keys only")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("identity file %s is readable by other users (mode %o); "
                       "run: chmod 600 %s", path, stat.S_IMODE(mode), path)
    return KeyPair(private_key, private_key.get_public_key())


def load_or_create_identity(path: str | os.PathLike[str]) -> KeyPair:
    """Load the identity at ``path``, creating it (mode 0600) if there is no file."""
    path = Path(path)
    try:
        return load_identity(path)
    except FileNotFoundError:
        pass
    key_pair = create_new_key_pair()
    data = key_pair.private_key.serialize()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process created it meanwhile
        except FileExistsError:
            return load_identity(path)
        logger.info("created a new identity in %s", path)
        return key_pair
    except OSError as exc:
        raise IdentityError(f"cannot create identity file {path}: {exc.strerror}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
