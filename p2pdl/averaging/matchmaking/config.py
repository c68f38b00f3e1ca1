"""Settings of matchmaking (protocols/matchmaking.md).  Every field has a documented default."""

from __future__ import annotations

import dataclasses

from ... import service
from ...errors import ConfigError
from ...service import is_int, is_number

#: Hard limits of the wire protocol, whatever a node's configuration says.
MAX_RUN_ID_LENGTH = service.MAX_RUN_ID_BYTES  # bytes of a run id (UTF-8), 1 at least
MAX_EPOCH = 2**53           # largest epoch (exact in a float64, like progress reports)
MAX_GROUP_SIZE = 256        # members of one group; bound of target_group_size
MAX_PEER_ID_SIZE = 64       # bytes of a peer id on the wire (binary multihash)
GROUP_ID_SIZE = 32          # bytes of a group id (SHA-256)
MAX_CODE_LENGTH = 32        # characters of a rejection code
MAX_DETAIL_LENGTH = 200     # characters of a rejection's explanation
MAX_JOIN_WAIT = 600         # seconds a join request may ask to be held, at most
MAX_MATCHMAKING_TIME = 600  # seconds one form_group call may take, at most
MIN_RATE = 1                # bytes/s: the least bandwidth or reduce rate a peer may declare
MAX_RATE = 10**12           # bytes/s: the most bandwidth or reduce rate a peer may declare
MAX_REFUSED = 16            # peers a join request may name as refused (its latest bans)
MAX_CAPACITY_RATIO = 8      # a declared rate counts at most this far from the group's median
AGGREGATION_DIGEST_SIZE = 32  # bytes of an aggregation rule's digest (SHA-256)


@dataclasses.dataclass(frozen=True)
class MatchmakingConfig:
    """How a node forms averaging groups.  ``form_group`` may override the
    first three per call; every peer of a run should use the same values.

    Attributes:
        target_group_size: most members of one group (the leader included);
            a round of N ready peers forms ``ceil(N / target_group_size)``
            groups of nearly equal size.  Default 16 (1..MAX_GROUP_SIZE).
        min_group_size: a group with fewer members does not form: its leader
            disbands it and every member's round fails, unless it finds room
            in another group in time.  Default 2 (1..target_group_size).
        matchmaking_time: longest a ``form_group`` call takes; without a group
            by then it raises :class:`~p2pdl.errors.MatchmakingFailedError`.
            Default 15 s (at most MAX_MATCHMAKING_TIME).
        gather_time: pause between announcing oneself in the DHT and reading
            who else did, so that peers that became ready together see each
            other.  Default 0.5 s; at most a tenth of ``matchmaking_time`` is
            used.
        join_window: a leader finalizes its group once every member its plan
            expects has joined, or this long after it started leading.
            Default 4 s; at most a third of ``matchmaking_time`` is used, so
            that followers of a leader that vanished have time to retry, and
            at most the wire's ``handler_timeout`` - ``gather_time`` - 2 s, so
            that a held join request is never cut off by the wire.
        max_join_attempts: join requests one peer sends per round, at most
            (it asks each peer at most once).  Default 32.
        max_view_fetches: times one round reads the DHT for the ready peers,
            at most (once at the start, again when no known leader is left).
            Default 3.
        max_rounds: ``form_group`` calls one node runs at once.  Default 4.
        max_held_joins: join requests one node holds at once (waiting for
            its group to form); more are rejected ``busy``.  Default 256.
        expiration_margin: a peer's DHT announcement lives this long past the
            end of its ``matchmaking_time``.  Default 5 s.
    """

    target_group_size: int = 16
    min_group_size: int = 2
    matchmaking_time: float = 15.0
    gather_time: float = 0.5
    join_window: float = 4.0
    max_join_attempts: int = 32
    max_view_fetches: int = 3
    max_rounds: int = 4
    max_held_joins: int = 256
    expiration_margin: float = 5.0

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"MatchmakingConfig: {what}")

        check(is_int(self.target_group_size) and 1 <= self.target_group_size <= MAX_GROUP_SIZE,
              f"target_group_size must be an integer in 1..{MAX_GROUP_SIZE}")
        check(is_int(self.min_group_size)
              and 1 <= self.min_group_size <= self.target_group_size,
              "min_group_size must be an integer in 1..target_group_size")
        check(is_number(self.matchmaking_time)
              and 0 < self.matchmaking_time <= MAX_MATCHMAKING_TIME,
              f"matchmaking_time must be in (0, {MAX_MATCHMAKING_TIME}] seconds")
        for name in ("gather_time", "expiration_margin"):
            check(is_number(getattr(self, name)) and getattr(self, name) >= 0,
                  f"{name} must be a number >= 0")
        check(is_number(self.join_window) and self.join_window > 0,
              "join_window must be a positive number")
        for name in ("max_join_attempts", "max_view_fetches", "max_rounds", "max_held_joins"):
            check(is_int(getattr(self, name)) and getattr(self, name) >= 1,
                  f"{name} must be an integer >= 1")

