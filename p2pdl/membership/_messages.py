"""The membership protocol ``/p2pdl/membership/1.0.0`` (protocols/membership.md).  No I/O.

Request/response over the wire's RPC:

* ``membership.hello`` -- "here is my certificate of this run, and the
  sequence of the revocation list I obey"; answered ``membership.welcome``
  with the other side's certificate, its sequence, and its list when that is
  newer than the asker's;
* ``membership.get_revocations`` -- "send me your revocation list of this
  run"; answered ``membership.revocations`` (empty bytes: none).

Certificates and lists travel as their own encodings (``_certificates``),
bounded here and decoded strictly by the receiver.
"""

from __future__ import annotations

from typing import Annotated

from ..service import RunId
from ..wire import MaxLen, Message, Range, RpcProtocol
from .config import MAX_CERTIFICATE_SIZE, MAX_REVOCATION_LIST_SIZE, MAX_SEQUENCE

__all__ = ["MEMBERSHIP_PROTOCOL_ID", "MEMBERSHIP_PROTOCOL", "Hello", "Welcome",
           "GetRevocations", "Revocations"]

MEMBERSHIP_PROTOCOL_ID = "/p2pdl/membership/1.0.0"

CertificateBytes = Annotated[bytes, MaxLen(MAX_CERTIFICATE_SIZE)]
RevocationBytes = Annotated[bytes, MaxLen(MAX_REVOCATION_LIST_SIZE)]
Sequence = Annotated[int, Range(-1, MAX_SEQUENCE)]


class Hello(Message, tag="membership.hello"):
    """The asker's certificate of ``run_id`` (nil: none) and its revocation sequence
    (-1: no list)."""

    run_id: RunId
    certificate: CertificateBytes | None
    revocation_sequence: Sequence = -1


class Welcome(Message, tag="membership.welcome"):
    """The answerer's certificate (nil: none), its sequence, and its list when newer."""

    certificate: CertificateBytes | None
    revocation_sequence: Sequence = -1
    revocations: RevocationBytes = b""


class GetRevocations(Message, tag="membership.get_revocations"):
    run_id: RunId


class Revocations(Message, tag="membership.revocations"):
    revocations: RevocationBytes = b""


MEMBERSHIP_PROTOCOL = RpcProtocol.define(MEMBERSHIP_PROTOCOL_ID, [Hello, GetRevocations],
                                         [Welcome, Revocations])
