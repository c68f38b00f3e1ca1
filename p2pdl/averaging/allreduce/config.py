"""Settings of the all-reduce (protocols/allreduce.md).  Every field has a documented default."""

from __future__ import annotations

import dataclasses
import hashlib

import msgpack

from ...errors import ConfigError
from ...service import is_int, is_number
from .._aggregators import AUTO, Aggregator
from .._codecs import CodecPolicy

#: Hard limits of the all-reduce, whatever a node's configuration says.
MAX_CHUNK_VALUES = 2**20        # values per TENSOR frame of the all-reduce (4 MiB of float32)
MIN_CHUNK_VALUES = 2**10
MAX_AVERAGING_TIMEOUT = 3600.0  # seconds one all_reduce call may take, at most
MAX_CHUNKS_AHEAD = 64           # chunks a reducer may hold per sender, at most
MAX_EVIDENCE_ROUNDS = 2         # finished rounds whose committed chunks a reducer keeps


@dataclasses.dataclass(frozen=True)
class AllReduceConfig:
    """How a node averages with its group (protocols/allreduce.md).  ``all_reduce``
    takes one per call; every member of a group must use the same
    ``chunk_values``, ``codecs`` and ``aggregator`` (they are part of the
    layout every member checks).

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
        weight_slack, weight_slack_samples: a reducer caps each sender's
            weight at ``evidence * (1 + weight_slack) + weight_slack_samples``,
            where ``evidence`` is the largest sample count that sender's own
            signed progress reports for the group's epoch support (when the
            node tracks the run's progress; else there is no evidence cap).
            The evidence travels with the claim: a sender attaches its own
            latest signed report for the epoch to its ``ar.begin``, and the
            training layer signs one of exactly the samples it averages with
            just before every round, so an honest peer's weight equals its
            evidence and needs no slack.  The slack is for senders that
            attach no report (older versions, or a caller whose tracker was
            not told its count) and are judged by the last report pushed to
            the reducer, short by the last few batches.  Defaults 0.25 and
            0 samples: a claim beyond what was reported gains at most a
            quarter, and a peer that reported nothing at the epoch counts
            for nothing.
        max_weight_ratio: under a robust aggregator, no contributor's weight
            counts for more than this many times the lower median of the
            positive weights in the chunk (after the evidence bound, before
            the share cap): a claim of more samples than the group's typical
            member buys nothing beyond this factor, evidence or not, while
            fewer than half of the contributors inflate theirs.  With a
            ratio ``r`` a share ``f`` of inflating contributors holds at most
            ``f r / (f r + 1 - f)`` of the weight, below one half only while
            ``f < 1 / (1 + r)``: at 1 the robust rules keep their breakdown
            point of one half (at 2, three inflaters of eight held 6/11 and
            training diverged under every rule).  An honest peer that really
            processed more than the median's samples counts as the median
            (its values still count).  None: no such cap.  The weighted mean
            ignores it (it weighs by samples, for trusted clusters).
            Default 1 (>= 1).
        max_weight_share: in a chunk with at least 3 contributors of
            positive weight, no contributor's weight counts for more than
            this share of the chunk's total (each above it is lowered until
            it holds exactly this share; with ``n`` contributors the share is
            at least ``1/n``).  1 disables the cap.  Default 0.5.
        aggregator: how a reducer combines the contributors' copies of each
            chunk, once their weights are bounded (:class:`~p2pdl.averaging.
            Aggregator`: ``mean``, ``centered_clip``, ``trimmed_mean`` or
            ``median``).  Default CenteredClip with ``tau="auto"`` (a radius
            per chunk from its contributors' own spread): robust to a
            minority of members whatever values they send, with no radius to
            tune.  ``Aggregator()`` is the weighted mean: exact and cheaper,
            for members that trust each other, and not robust to a member's
            values (docs/security.md).
        outlier_factor: under a robust aggregator, a sender whose values
            lie more than this many times the reference distance from the
            results of its reducer's part (the contributors' median distance
            in each chunk of at least 3 contributors, and at least ``tau``
            under a fixed CenteredClip radius; judged over the whole part,
            at least 64 values) is flagged ``outlier_values`` in the node's
            flag book, once per round; the book bans a peer flagged so
            ``BAN_AFTER`` times (docs/security.md).  None: nobody is
            flagged.  Default 10 (> 1).
        verify: after the round, check every other member's result
            (protocols/allreduce.md, Verification): a part whose check fails
            is dropped (the caller keeps no update there) and its reducer
            flagged ``reducer_check_failed``.  Meaningful under CenteredClip,
            where what a lying contributor can cover is bounded; under the
            mean a check fails only when every contributor reports.  Each
            member sends each other member a signed report of about 1 KiB
            per part it contributed to.  A member whose check fails disputes
            the part with its reducer, which shows the committed chunks of
            the contributors whose reports it disputes: a contributor proven
            to have lied is flagged ``report_lie`` and the part judged again
            with its true report; a reducer that shows nothing that clears
            its part is flagged ``reducer_lie`` (both ban at once).  A
            reducer that does not answer is flagged
            ``reducer_check_failed``.  A verifying reducer keeps its
            contributors' chunks as they arrived (one more copy of its part
            per contributor, in the codec's form) for ``evidence_seconds``
            after its round, and refuses senders without a valid signed
            commitment.  Default True.
        evidence_seconds: how long a reducer keeps its contributors'
            committed chunks after its round to answer disputes; only the
            last MAX_EVIDENCE_ROUNDS rounds keep them.  Default 60 (> 0).
        accusation_interval: in a certificate run this node holds a
            certificate of, how often it reads the accusations the run's
            members published (proofs that a reducer signed two different
            results: each true one bans the reducer, each false one its
            publisher); its own proofs are published at once.  Only the
            node's service config counts.  Default 30 s (> 0).
        max_chunks_ahead: a reducer reads a sender's chunks at most this
            many ahead of the first chunk still waiting for some sender, and
            holds them (decoded, float32) until that chunk can be averaged
            over exactly its contributors; beyond that it stops reading the
            sender (the wire's credit holds it back).  Memory: at most
            ``senders * max_chunks_ahead * chunk_values * 4`` bytes per
            round.  Default 2 (1..MAX_CHUNKS_AHEAD).
    """

    codecs: CodecPolicy = dataclasses.field(default_factory=lambda: CodecPolicy())
    chunk_values: int = 2**20
    sender_timeout: float = 10.0
    reducer_timeout: float = 20.0
    averaging_timeout: float = 120.0
    join_wait: float = 10.0
    max_waiting_streams: int = 256
    max_rounds: int = 4
    weight_slack: float = 0.25
    weight_slack_samples: float = 0
    max_weight_share: float = 0.5
    max_weight_ratio: float | None = 1.0
    max_chunks_ahead: int = 2
    aggregator: Aggregator = dataclasses.field(
        default_factory=lambda: Aggregator("centered_clip", tau=AUTO))
    outlier_factor: float | None = 10.0
    verify: bool = True
    evidence_seconds: float = 60.0
    accusation_interval: float = 30.0

    @property
    def caps(self) -> tuple[float, float | None]:
        """``(max_weight_share, max_weight_ratio)``: the weight caps, part of the
        layout under a robust rule (verifiers check the claims against them)."""
        return self.max_weight_share, self.max_weight_ratio

    def aggregation_digest(self) -> bytes | None:
        """What matchmaking compares (``form_group(aggregation=...)``): SHA-256
        of the rule's description and the caps (in the domain of layout
        version 2, so peers of different digests never share a group); None for the mean (what
        peers that know no other rule send).  A leader refuses a joiner with
        another (``mismatch``), so a group never mixes rules or caps."""
        if self.aggregator.name == "mean":
            return None
        share, ratio = self.caps
        return hashlib.sha256(msgpack.packb(
            ["p2pdl/aggregator/4", self.aggregator.describe(),
             ["caps", float(share), None if ratio is None else float(ratio)]])).digest()

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"AllReduceConfig: {what}")

        check(isinstance(self.codecs, CodecPolicy), "codecs must be a CodecPolicy")
        check(isinstance(self.aggregator, Aggregator), "aggregator must be an Aggregator")
        check(is_int(self.chunk_values)
              and MIN_CHUNK_VALUES <= self.chunk_values <= MAX_CHUNK_VALUES,
              f"chunk_values must be an integer in {MIN_CHUNK_VALUES}..{MAX_CHUNK_VALUES}")
        for name in ("sender_timeout", "reducer_timeout", "join_wait", "evidence_seconds",
                     "accusation_interval"):
            check(is_number(getattr(self, name)) and getattr(self, name) > 0,
                  f"{name} must be a positive number of seconds")
        check(is_number(self.averaging_timeout)
              and 0 < self.averaging_timeout <= MAX_AVERAGING_TIMEOUT,
              f"averaging_timeout must be in (0, {MAX_AVERAGING_TIMEOUT:.0f}] seconds")
        check(self.reducer_timeout >= self.sender_timeout,
              "reducer_timeout must be at least sender_timeout (a reducer may wait that "
              "long for a slow sender before it sends anything)")
        for name in ("max_waiting_streams", "max_rounds"):
            check(is_int(getattr(self, name)) and getattr(self, name) >= 1,
                  f"{name} must be an integer >= 1")
        for name in ("weight_slack", "weight_slack_samples"):
            check(is_number(getattr(self, name)) and getattr(self, name) >= 0,
                  f"{name} must be a finite number >= 0")
        check(is_number(self.max_weight_share) and 0 < self.max_weight_share <= 1,
              "max_weight_share must be in (0, 1]")
        check(self.max_weight_ratio is None
              or (is_number(self.max_weight_ratio) and self.max_weight_ratio >= 1),
              "max_weight_ratio must be None or a number >= 1")
        check(self.outlier_factor is None
              or (is_number(self.outlier_factor) and self.outlier_factor > 1),
              "outlier_factor must be None or a number > 1")
        check(isinstance(self.verify, bool), "verify must be True or False")
        check(is_int(self.max_chunks_ahead) and 1 <= self.max_chunks_ahead <= MAX_CHUNKS_AHEAD,
              f"max_chunks_ahead must be an integer in 1..{MAX_CHUNKS_AHEAD}")
