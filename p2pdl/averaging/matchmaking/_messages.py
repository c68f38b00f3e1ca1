"""Messages of the matchmaking protocol ``/p2pdl/matchmaking/1.0.0`` (protocols/matchmaking.md).

A follower sends ``mm.join`` to the peer it wants as leader; the leader holds
the request until its group is final and answers ``mm.formed`` (the group) or
``mm.rejected`` (why not).
"""

from __future__ import annotations

from typing import Annotated

from ...wire import MaxLen, Message, Range, RpcProtocol
from .config import (
    AGGREGATION_DIGEST_SIZE,
    GROUP_ID_SIZE,
    MAX_CODE_LENGTH,
    MAX_DETAIL_LENGTH,
    MAX_EPOCH,
    MAX_GROUP_SIZE,
    MAX_JOIN_WAIT,
    MAX_PEER_ID_SIZE,
    MAX_RATE,
    MAX_REFUSED,
    MAX_RUN_ID_LENGTH,
    MIN_RATE,
)

MATCHMAKING_PROTOCOL_ID = "/p2pdl/matchmaking/1.0.0"

#: Why a leader turned a join request down (protocols/matchmaking.md, Errors).
REJECT_CODES = {
    "full": "the group already has target_group_size members",
    "not_leader": "the peer does not lead a group in this round (it follows, or gave up leading)",
    "finalized": "the group was already formed",
    "disbanded": "the leader gave up its group before it formed (too small, or its round ended)",
    "wrong_epoch": "the peer is matchmaking for this run, but for another epoch",
    "unknown_run": "the peer is not matchmaking for this run",
    "mismatch": "the request's target_group_size or aggregation rule differs from the "
                "leader's",
    "expired": "the request's wait ended before the group formed",
    "busy": "the peer holds as many join requests as it may",
    "excluded": "the group formed without the peer: a member refuses it and the leader "
                "holds evidence against it too, or it refuses a member the leader holds "
                "none against",
}


#: A bandwidth or reduce rate in bytes per second; nil: unknown.
Rate = Annotated[float, Range(MIN_RATE, MAX_RATE)]
#: A share of the averaged vector.
Fraction = Annotated[float, Range(0, 1)]


class Join(Message, tag="mm.join"):
    """Let me into your group for this run and epoch; I wait ``wait`` seconds.

    ``auxiliary``, ``bandwidth`` and ``reduce_rate`` feed the leader's load
    plan (a client-mode peer cannot be auxiliary).  ``aggregation``: the
    digest of the all-reduce aggregation rule the peer averages with
    (``aggregation_digest``); nil: the plain mean.  ``refuses``: peers the
    joiner will not average with (those it banned from the run, at most
    MAX_REFUSED); the leader keeps such a pair out of one group
    (protocols/matchmaking.md, Refused members).
    """

    run_id: Annotated[str, MaxLen(MAX_RUN_ID_LENGTH)]  # the same bound as service.RunId
    epoch: Annotated[int, Range(0, MAX_EPOCH)]
    target_group_size: Annotated[int, Range(1, MAX_GROUP_SIZE)]
    client_mode: bool
    wait: Annotated[float, Range(0, MAX_JOIN_WAIT)]
    auxiliary: bool = False
    bandwidth: Rate | None = None
    reduce_rate: Rate | None = None
    aggregation: Annotated[bytes, MaxLen(AGGREGATION_DIGEST_SIZE)] | None = None
    refuses: Annotated[list[Annotated[bytes, MaxLen(MAX_PEER_ID_SIZE)]],
                       MaxLen(MAX_REFUSED)] | None = None


class MemberEntry(Message, tag="mm.member"):
    """One member of a formed group, as it joined."""

    peer: Annotated[bytes, MaxLen(MAX_PEER_ID_SIZE)]
    client_mode: bool
    auxiliary: bool = False
    bandwidth: Rate | None = None
    reduce_rate: Rate | None = None


class Formed(Message, tag="mm.formed"):
    """The group is final: its id, its members (the leader first) and the
    leader's load plan (one fraction per member, or nil)."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    members: Annotated[list[MemberEntry], MaxLen(MAX_GROUP_SIZE)]
    fractions: Annotated[list[Fraction], MaxLen(MAX_GROUP_SIZE)] | None = None


class Rejected(Message, tag="mm.rejected"):
    """Not in this group: ``code`` says why (REJECT_CODES), ``detail`` for people."""

    code: Annotated[str, MaxLen(MAX_CODE_LENGTH)]
    detail: Annotated[str, MaxLen(MAX_DETAIL_LENGTH)] = ""


MATCHMAKING_PROTOCOL = RpcProtocol.define(MATCHMAKING_PROTOCOL_ID, [Join], [Formed, Rejected])
