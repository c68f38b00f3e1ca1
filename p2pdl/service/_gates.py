"""How the node composes its gate, sans-IO: a user's gate and the run
memberships (:class:`BothGates`), then the bans of its flag book
(:class:`BanningGate`).

The node's :class:`~p2pdl.service.Gatekeeper` asks the outermost one; the
services read the same object as their :class:`MembershipView`.
"""

from __future__ import annotations

from collections.abc import Callable

from libp2p.peer.id import ID

from ._admission import AdmissionGate, Refusal, Role
from ._flags import FlagBook

__all__ = ["BanningGate", "BothGates"]


class BanningGate:
    """``gate`` with the node's bans: a peer banned from a run (``flags``) is
    refused there and is no member of it; everything else is ``gate``'s."""

    def __init__(self, gate: AdmissionGate, flags: FlagBook, clock: Callable[[], float]) -> None:
        self.gate = gate
        self.flags = flags
        self.clock = clock

    def admit(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None:
        if self.flags.is_banned(peer, run_id, self.clock()):
            return Refusal("banned from this run (docs/security.md, Bans)")
        return self.gate.admit(peer, protocol_id, run_id)

    def is_member(self, peer: ID, run_id: str) -> bool:
        return not self.flags.is_banned(peer, run_id, self.clock()) \
            and self.gate.is_member(peer, run_id)

    def role_of(self, peer: ID, run_id: str) -> Role | None:
        return self.gate.role_of(peer, run_id)

    def credential(self, run_id: str) -> bytes | None:
        return self.gate.credential(run_id)

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool:
        return self.gate.learn(peer, run_id, credential) and self.is_member(peer, run_id)


class BothGates:
    """A user's gate and the node's run memberships: a request passes only if
    both admit it, a peer is a member only if both say so.

    A user's gate may implement ``admit`` alone: where it lacks
    ``is_member``, ``role_of``, ``credential`` or ``learn``, the memberships
    answer by themselves."""

    def __init__(self, gate: AdmissionGate, membership: AdmissionGate) -> None:
        self.gate = gate
        self.membership = membership

    def admit(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None:
        return (self.gate.admit(peer, protocol_id, run_id)
                or self.membership.admit(peer, protocol_id, run_id))

    def is_member(self, peer: ID, run_id: str) -> bool:
        is_member = getattr(self.gate, "is_member", None)
        return self.membership.is_member(peer, run_id) and (
            is_member is None or bool(is_member(peer, run_id)))

    def role_of(self, peer: ID, run_id: str) -> Role | None:
        role_of = getattr(self.gate, "role_of", None)
        role = role_of(peer, run_id) if role_of is not None else None
        return role if role is not None else self.membership.role_of(peer, run_id)

    def credential(self, run_id: str) -> bytes | None:
        credential = self.membership.credential(run_id)
        own = getattr(self.gate, "credential", None)
        return credential if credential is not None or own is None else own(run_id)

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool:
        self.membership.learn(peer, run_id, credential)
        learn = getattr(self.gate, "learn", None)
        if learn is not None:
            learn(peer, run_id, credential)
        return self.is_member(peer, run_id)
