"""The progress protocol ``/p2pdl/progress/1.0.0``: reports, pushes, signatures.  No I/O.

A report is signed by its peer's key over a fixed msgpack array (the
signing payload below), so it can be forwarded by anyone and stored in the
DHT unchanged.  Types are checked by the decoder (a wrong type resets the
stream); values (negative counts, absurd rates, future times) are checked by
the receiver, which drops and counts such reports without resetting the
stream, since a forwarder is not to blame for a report it relays.

A report may carry its peer's membership credential (certificate bytes, in
runs that need one) beside the signed fields, so that a receiver that never
met that peer can learn its membership from a forwarded report or a DHT
snapshot.  The credential is not part of the signed payload (it is its
authority's signed statement about the peer, checked as such), and old
receivers ignore the field.

A report may also carry :class:`ReportInfo` (a display name, the recent
training loss, how the peer is reached), for people watching the run.  Only
a report that carries it signs it: its payload is then the first one with
the info's fields appended, under its own domain (SIGNATURE_DOMAIN_INFO), so
an info cannot be moved onto, or stripped from, another report.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, Literal

import msgpack
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from ..service import RunId
from ..wire import MaxLen, Message, Range, RpcProtocol
from .config import (
    MAX_ADDR_LENGTH,
    MAX_ADDRS,
    MAX_COUNT,
    MAX_CREDENTIAL_SIZE,
    MAX_DIGEST,
    MAX_GROUP,
    MAX_NAME_LENGTH,
    MAX_PEER_ID_SIZE,
    MAX_REPORTS,
    MAX_ROUND_CONTRIBUTORS,
    MAX_SIGNATURE_SIZE,
    ROUND_TAG_SIZE,
)

__all__ = ["PROGRESS_PROTOCOL_ID", "PROGRESS_PROTOCOL", "Report", "ReportInfo", "PATH_KINDS",
           "ROUND_OUTCOMES", "Push", "Reports", "DigestEntry", "SnapshotEntry", "SIGNATURE_DOMAIN",
           "SIGNATURE_DOMAIN_INFO", "signing_payload", "sign_report", "verify_report",
           "round_tag", "round_tags"]

PROGRESS_PROTOCOL_ID = "/p2pdl/progress/1.0.0"
SIGNATURE_DOMAIN = "p2pdl/progress/report/1"
SIGNATURE_DOMAIN_INFO = "p2pdl/progress/report-info/1"
#: How a peer is reached (:attr:`ReportInfo.path`).
PATH_KINDS = ("direct", "hole-punched", "relayed")
#: How a peer's last averaging round ended (:attr:`ReportInfo.round_outcome`).
ROUND_OUTCOMES = ("averaged", "partial", "alone", "failed")

PeerBytes = Annotated[bytes, MaxLen(MAX_PEER_ID_SIZE)]


class ReportInfo(Message, tag="progress.info"):
    """What a peer says of itself for people watching the run (signed with
    its report; every field optional): a display ``name`` (printable, at
    most MAX_NAME_LENGTH characters), its recent training ``loss`` and its
    ``path``: ``relayed`` when one of its connections runs through a relay,
    else ``hole-punched`` when one was opened by hole punching, else
    ``direct``; and its last averaging round: its epoch, how it ended
    (``averaged``, ``partial``, ``alone``, ``failed``), the group's size and
    the other members whose values its own part took (their
    :func:`round_tag`, ascending; at most MAX_ROUND_CONTRIBUTORS,
    :func:`round_tags`).  Nothing in it counts for training: it is the
    peer's word (a monitor credits a peer's samples only where another
    member's word names it)."""

    name: Annotated[str, MaxLen(MAX_NAME_LENGTH)] | None = None
    loss: float | None = None
    path: Literal["direct", "hole-punched", "relayed"] | None = None
    round_epoch: Annotated[int, Range(0, MAX_COUNT)] | None = None
    round_outcome: Literal["averaged", "partial", "alone", "failed"] | None = None
    round_group: Annotated[int, Range(0, MAX_GROUP)] | None = None
    round_contributors: Annotated[tuple[Annotated[bytes, MaxLen(ROUND_TAG_SIZE)], ...],
                                  MaxLen(MAX_ROUND_CONTRIBUTORS)] | None = None


def round_tag(peer_id: bytes) -> bytes:
    """A peer's tag in a report's round contributors: the first ROUND_TAG_SIZE
    bytes of SHA-256 of its peer id bytes."""
    return hashlib.sha256(peer_id).digest()[:ROUND_TAG_SIZE]


def round_tags(reporter: bytes, contributors: Iterable[bytes]) -> tuple[bytes, ...]:
    """The ``round_contributors`` a peer ``reporter`` gives for the members
    (peer id bytes) whose values its part took: their tags, itself left out,
    ascending; of more than MAX_ROUND_CONTRIBUTORS, those that follow its own
    tag in ascending order, wrapping around (so that in a large group each
    member is named by some reducers, not always the same ones left out)."""
    mine = round_tag(reporter)
    tags = sorted({round_tag(c) for c in contributors} - {mine})
    if len(tags) <= MAX_ROUND_CONTRIBUTORS:
        return tuple(tags)
    after = [t for t in tags if t > mine] + [t for t in tags if t < mine]
    return tuple(sorted(after[:MAX_ROUND_CONTRIBUTORS]))


class Report(Message, tag="progress.report"):
    """One peer's progress in one run, signed by that peer."""

    run_id: RunId
    peer_id: PeerBytes
    epoch: int
    samples_accumulated: int
    samples_per_second: float
    time: float
    client_mode: bool
    auxiliary: bool
    signature: Annotated[bytes, MaxLen(MAX_SIGNATURE_SIZE)]
    credential: Annotated[bytes, MaxLen(MAX_CREDENTIAL_SIZE)] | None = None
    info: ReportInfo | None = None


class DigestEntry(Message, tag="progress.digest_entry"):
    """What a peer knows of another: the time of its latest report."""

    peer_id: PeerBytes
    time: float


class Push(Message, tag="progress.push"):
    """Reports for ``run_id``; with ``want_reply`` the answer carries what the
    receiver knows that ``digest`` says the sender lacks."""

    run_id: RunId
    reports: Annotated[tuple[Report, ...], MaxLen(MAX_REPORTS)]
    want_reply: bool = False
    digest: Annotated[tuple[DigestEntry, ...], MaxLen(MAX_DIGEST)] = ()


class Reports(Message, tag="progress.reports"):
    """The answer to a push: reports the pusher lacks (empty unless it asked)."""

    reports: Annotated[tuple[Report, ...], MaxLen(MAX_REPORTS)] = ()


class SnapshotEntry(Message, tag="progress.snapshot"):
    """A peer's entry in the DHT snapshot of a run: its signed report and its addresses."""

    report: Report
    addrs: Annotated[tuple[Annotated[str, MaxLen(MAX_ADDR_LENGTH)], ...], MaxLen(MAX_ADDRS)] = ()


PROGRESS_PROTOCOL = RpcProtocol.define(PROGRESS_PROTOCOL_ID, [Push], [Reports])


def signing_payload(run_id: str, peer_id: bytes, epoch: int, samples_accumulated: int,
                    samples_per_second: float, time: float, client_mode: bool,
                    auxiliary: bool, info: ReportInfo | None = None) -> bytes:
    """The bytes a peer signs: the domain, then every field of the report but
    the signature and the credential; with ``info``, under
    SIGNATURE_DOMAIN_INFO with the info's name, loss, path and last round
    appended (its contributors only where it names them)."""
    fields = [run_id, peer_id, epoch, samples_accumulated, float(samples_per_second),
              float(time), client_mode, auxiliary]
    if info is None:
        return msgpack.packb([SIGNATURE_DOMAIN, *fields], use_bin_type=True)
    loss = None if info.loss is None else float(info.loss)
    said = [info.name, loss, info.path, info.round_epoch, info.round_outcome, info.round_group]
    if info.round_contributors is not None:
        said.append(list(info.round_contributors))
    return msgpack.packb([SIGNATURE_DOMAIN_INFO, *fields, *said], use_bin_type=True)


def sign_report(private_key: PrivateKey, peer_id: ID, run_id: str, epoch: int,
                samples_accumulated: int, samples_per_second: float, time: float,
                client_mode: bool, auxiliary: bool = False, *,
                credential: bytes | None = None, info: ReportInfo | None = None) -> Report:
    """A report signed by ``private_key``, carrying ``credential`` (unsigned)
    and ``info`` (signed) if given."""
    raw = peer_id.to_bytes()
    payload = signing_payload(run_id, raw, epoch, samples_accumulated, samples_per_second,
                              time, client_mode, auxiliary, info)
    return Report(run_id, raw, epoch, samples_accumulated, float(samples_per_second),
                  float(time), client_mode, auxiliary, private_key.sign(payload), credential,
                  info)


def verify_report(report: Report) -> ID | None:
    """The report's peer id if its signature verifies under the key in that id, else None."""
    try:
        peer = ID(report.peer_id)
        public_key = peer.extract_public_key()
        if public_key is None:
            return None
        payload = signing_payload(report.run_id, report.peer_id, report.epoch,
                                  report.samples_accumulated, report.samples_per_second,
                                  report.time, report.client_mode, report.auxiliary,
                                  report.info)
        return peer if public_key.verify(payload, report.signature) else None
    except Exception:  # untrusted bytes: any decoding failure means "not signed by it"
        return None
