"""Settings of matchmaking (protocols/matchmaking.md).  Every field has a documented default."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from ._codecs import CodecPolicy

#: Hard limits of the wire protocol, whatever a node's configuration says.
MAX_RUN_ID_LENGTH = 128     # bytes of a run id (UTF-8), 1 at least
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

        check(_is_int(self.target_group_size) and 1 <= self.target_group_size <= MAX_GROUP_SIZE,
              f"target_group_size must be an integer in 1..{MAX_GROUP_SIZE}")
        check(_is_int(self.min_group_size)
              and 1 <= self.min_group_size <= self.target_group_size,
              "min_group_size must be an integer in 1..target_group_size")
        check(_is_number(self.matchmaking_time)
              and 0 < self.matchmaking_time <= MAX_MATCHMAKING_TIME,
              f"matchmaking_time must be in (0, {MAX_MATCHMAKING_TIME}] seconds")
        for name in ("gather_time", "expiration_margin"):
            check(_is_number(getattr(self, name)) and getattr(self, name) >= 0,
                  f"{name} must be a number >= 0")
        check(_is_number(self.join_window) and self.join_window > 0,
              "join_window must be a positive number")
        for name in ("max_join_attempts", "max_view_fetches", "max_rounds", "max_held_joins"):
            check(_is_int(getattr(self, name)) and getattr(self, name) >= 1,
                  f"{name} must be an integer >= 1")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value and value not in (float("inf"), float("-inf"))


#: Hard limits of the all-reduce, whatever a node's configuration says.
MAX_CHUNK_VALUES = 2**20        # values per TENSOR frame of the all-reduce (4 MiB of float32)
MIN_CHUNK_VALUES = 2**10
MAX_AVERAGING_TIMEOUT = 3600.0  # seconds one all_reduce call may take, at most


@dataclasses.dataclass(frozen=True)
class AllReduceConfig:
    """How a node averages with its group (protocols/allreduce.md).  ``all_reduce``
    takes one per call; every member of a group must use the same
    ``chunk_values`` and ``codecs`` (they are part of the layout every member
    checks).

    Attributes:
        codecs: which codec each tensor travels with, by size
            (:class:`~p2pdl.averaging.CodecPolicy`).  Default: tensors of
            fewer than 2**16 values exact, larger ones fp16.
        chunk_values: values per chunk (one TENSOR frame).  Reducers average
            and send back chunk by chunk, so a smaller chunk overlaps sending,
            reducing and receiving more finely; a larger one costs fewer
            frames, and py-libp2p's cost is per frame: on loopback, 2**20
            values moved 10M values among 4 peers with about 20 % less CPU
            than 2**18.  Default 2**20 (4 MiB of float32, 2 MiB in fp16:
            0.3 s at 50 Mbit/s); MIN_CHUNK_VALUES..MAX_CHUNK_VALUES.
        sender_timeout: a reducer excludes a sender that has sent nothing
            (its ``ar.begin``, or its next chunk) for this long while the
            reducer still waits for it; the chunks it already sent still
            count.  Default 10 s.
        reducer_timeout: a sender gives up on a reducer that has sent
            nothing for this long while results are due; that part keeps the
            peer's local values.  Default 20 s; at least ``sender_timeout``
            (a reducer may wait that long for a slow sender before it can send
            anything).
        averaging_timeout: longest an ``all_reduce`` call takes, everything
            included; parts not complete by then keep their local values.
            Default 120 s (at most MAX_AVERAGING_TIMEOUT).
        join_wait: how long a stream for a group this node does not yet
            average with waits for the local ``all_reduce`` to start (members
            learn their group at slightly different moments).  Default 10 s.
        max_waiting_streams: streams waiting for their group's all-reduce to
            start, at most, and at most ``max_rounds`` of them from one peer
            (more are rejected ``busy``).  Each may hold a receive window of
            data (``WireConfig.receive_window``, 8 MiB), so this bounds that
            memory too.  Default 256.
        max_rounds: ``all_reduce`` calls one node runs at once.  Default 4.
    """

    codecs: CodecPolicy = dataclasses.field(default_factory=lambda: CodecPolicy())
    chunk_values: int = 2**20
    sender_timeout: float = 10.0
    reducer_timeout: float = 20.0
    averaging_timeout: float = 120.0
    join_wait: float = 10.0
    max_waiting_streams: int = 256
    max_rounds: int = 4

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"AllReduceConfig: {what}")

        check(isinstance(self.codecs, CodecPolicy), "codecs must be a CodecPolicy")
        check(_is_int(self.chunk_values)
              and MIN_CHUNK_VALUES <= self.chunk_values <= MAX_CHUNK_VALUES,
              f"chunk_values must be an integer in {MIN_CHUNK_VALUES}..{MAX_CHUNK_VALUES}")
        for name in ("sender_timeout", "reducer_timeout", "join_wait"):
            check(_is_number(getattr(self, name)) and getattr(self, name) > 0,
                  f"{name} must be a positive number of seconds")
        check(_is_number(self.averaging_timeout)
              and 0 < self.averaging_timeout <= MAX_AVERAGING_TIMEOUT,
              f"averaging_timeout must be in (0, {MAX_AVERAGING_TIMEOUT:.0f}] seconds")
        check(self.reducer_timeout >= self.sender_timeout,
              "reducer_timeout must be at least sender_timeout (a reducer may wait that "
              "long for a slow sender before it sends anything)")
        for name in ("max_waiting_streams", "max_rounds"):
            check(_is_int(getattr(self, name)) and getattr(self, name) >= 1,
                  f"{name} must be an integer >= 1")
