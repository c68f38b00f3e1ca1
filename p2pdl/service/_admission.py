"""The admission gate: which peer may use which protocol, for which run.  Sans-IO.

Every inbound request and stream of every p2pdl protocol a node serves passes
the node's gate before a handler sees it (``_endpoints``).  The gate answers
from what the node already knows (a membership table, certificates checked
earlier, a ban list); it never waits.  Request/response protocols answer a
refused request with the error reply ``not_admitted``; streaming protocols send
their own refusal with that code; the node keeps serving everyone else.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from typing import Protocol

from libp2p.peer.id import ID

__all__ = ["NOT_ADMITTED", "Refusal", "Role", "AdmissionGate", "MembershipView",
           "OpenAdmission", "Gatekeeper", "AdmissionStatistics", "MAX_LOGGED_PEERS"]

logger = logging.getLogger(__name__)

#: The refusal code every protocol uses for a request the gate refused.
NOT_ADMITTED = "not_admitted"
#: Refused peers remembered for logging each of them once (least recent dropped).
MAX_LOGGED_PEERS = 1024


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a request was refused; ``reason`` is sent to the peer, so it says no secret."""

    reason: str
    code: str = NOT_ADMITTED


class Role(enum.Enum):
    """What a member of a run may do there (certificate runs name it)."""

    TRAINER = "trainer"        # computes gradients, reports samples, averages, donates state
    AUXILIARY = "auxiliary"    # averages (reduces) and donates state, reports no samples
    MONITOR = "monitor"        # follows progress and downloads state; never averages


class MembershipView(Protocol):
    """What services read of a run's membership once a request is admitted.

    ``role_of`` is the member's role where the run binds roles (certificate
    runs); None where it does not (open and allowlist runs, where a peer's
    word about its role is all there is) or where the peer is no member.
    ``is_member`` says whether the peer belongs to the run as far as this node
    knows now (an open run: every peer).  ``credential`` is this node's own
    proof of membership of a run (certificate bytes), for services to attach
    where other peers learn of it without a connection (a DHT record, a
    gossiped report); None where the run needs none.  ``learn`` offers a
    credential of ``peer`` learnt that way: it is checked as if the peer had
    presented it, and True means the peer is now known as a member.  All are
    quick and never wait.
    """

    def is_member(self, peer: ID, run_id: str) -> bool: ...

    def role_of(self, peer: ID, run_id: str) -> Role | None: ...

    def credential(self, run_id: str) -> bytes | None: ...

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool: ...


class AdmissionGate(MembershipView, Protocol):
    """Decides, for each inbound request, whether its peer may make it.

    ``run_id`` is the run the request belongs to, or None for protocols that
    serve the whole network (ping, DHT, dial-back).  Return None to admit, a
    :class:`Refusal` to refuse.  Called on the node's trio thread for every
    request: it must be quick and must not block.
    """

    def admit(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None: ...


class OpenAdmission:
    """Admits every peer to everything: a run is open to anyone who knows its id."""

    def admit(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None:
        return None

    def is_member(self, peer: ID, run_id: str) -> bool:
        return True

    def role_of(self, peer: ID, run_id: str) -> Role | None:
        return None

    def credential(self, run_id: str) -> bytes | None:
        return None

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class AdmissionStatistics:
    """What the node's gate decided: requests admitted and refused, and by protocol."""

    admitted: int
    refused: int
    refused_by_protocol: dict[str, int]

    def __getitem__(self, name: str) -> object:
        return getattr(self, name)


class Gatekeeper:
    """The node's use of its gate: asks it, counts, logs each refused peer once."""

    def __init__(self, gate: AdmissionGate) -> None:
        self.gate = gate
        self._admitted = 0
        self._refused: collections.Counter[str] = collections.Counter()
        self._logged: collections.OrderedDict[ID, None] = collections.OrderedDict()

    def check(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None:
        refusal = self.gate.admit(peer, protocol_id, run_id)
        if refusal is None:
            self._admitted += 1
            return None
        self._refused[protocol_id] += 1
        if peer not in self._logged:
            logger.info("refused %s from %s%s: %s", protocol_id, peer,
                        f" (run {run_id!r})" if run_id is not None else "", refusal.reason)
            self._logged[peer] = None
            if len(self._logged) > MAX_LOGGED_PEERS:
                self._logged.popitem(last=False)
        return refusal

    def is_member(self, peer: ID, run_id: str) -> bool:
        return self.gate.is_member(peer, run_id)

    def role_of(self, peer: ID, run_id: str) -> Role | None:
        return self.gate.role_of(peer, run_id)

    def credential(self, run_id: str) -> bytes | None:
        return self.gate.credential(run_id)

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool:
        return self.gate.learn(peer, run_id, credential)

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(self._admitted, sum(self._refused.values()),
                                   dict(self._refused))
