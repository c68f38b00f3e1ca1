"""Settings of the training layer: :class:`OptimizerConfig`, with documented defaults.

State sync's settings are ``p2pdl.statesync.config``.
"""

from __future__ import annotations

import dataclasses

from ..averaging import AllReduceConfig
from ..errors import ConfigError
from ..progress import check_info
from ..service import is_number, is_positive

__all__ = ["OptimizerConfig", "MODES", "ON_FAILURE", "MAX_STEP_SAMPLES"]

MODES = ("dedloc", "diloco")
ON_FAILURE = ("local", "skip")
#: Largest batch a single ``step`` may report.
MAX_STEP_SAMPLES = 2**31


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """How a :class:`Optimizer` trains with the swarm.  Every field has a default.

    Attributes:
        batch_size_per_step: samples in each ``step`` when ``step()`` is
            called without ``batch_size`` (None: the call must say).
        mode: ``"dedloc"`` (average gradients, one global step per epoch) or
            ``"diloco"`` (local inner steps, then an outer step on the
            averaged parameter deltas).
        on_failure: what a round that found no group does: ``"local"``
            (step with this peer's own gradients or delta, as hivemind does)
            or ``"skip"`` (drop them; in DiLoCo mode go back to the last
            shared parameters).  The epoch advances either way.
        clip_grad_norm: clip the (averaged) gradients to this total norm
            before the step (None: no clipping).  In DiLoCo mode it clips
            each inner step's gradients.
        clip_sent_norm: clip what this peer sends to the all-reduce (its
            mean gradients, or its DiLoCo delta) to this total norm before
            the round (None: no clipping).  It bounds this peer's own
            contribution, and, with a robust aggregator
            (``AllReduceConfig.aggregator``), keeps honest peers'
            differences comparable to CenteredClip's ``tau``: set ``tau``
            near this norm.
        sent_momentum: DeDLOC mode: send this peer's momentum of its mean
            gradients instead of the mean itself: worker momentum (Karimireddy
            et al. 2021).  With a robust aggregator honest momenta agree more
            closely than single gradients, so an attacker that hides inside
            the honest spread round after round gains far less.  ``"auto"``
            (the default) takes over the wrapped optimizer's own momentum:
            SGD's ``momentum`` (no dampening, not Nesterov) becomes this
            peer's ``m = mu m + mean`` and SGD's is set to 0, so an honest
            swarm steps as before; Adam's and AdamW's ``betas[0]`` becomes
            Adam's bias-corrected first moment computed here, and ``betas``
            become ``(0, b2)`` (the second moment then follows the averaged
            moments' squares).  An optimizer without such a momentum (SGD
            with none, another kind) sends its mean gradients, unprotected
            by worker momentum.  A number ``beta`` in [0, 1) sends
            ``m = beta * m + mean`` and leaves the wrapped optimizer alone
            (give it no momentum of its own); None sends the mean.  Each
            peer's momentum is its own: it is not in the shared state or in
            checkpoints, and starts at zero after a restart.  DiLoCo mode
            ignores ``"auto"`` (it has its outer momentum).
        delay_updates: average in the background while the next batches
            compute and apply the result one step late.  DeDLOC mode: the
            averaged gradients step the parameters in the first ``step()``
            after the round ends.  DiLoCo mode: the inner steps go on from
            this peer's parameters while the outer delta is averaged; the
            outer step, once the round ends, moves the anchor and carries the
            inner steps taken since over to it (one more copy of the
            parameters while a round runs).
        error_feedback: add to what this peer sends in a round what the
            all-reduce's codecs rounded off its values in the last one (its
            gradients, momentum or DiLoCo delta), so that over rounds the
            rounding cancels out instead of adding up.  ``"auto"`` (the
            default): on when the all-reduce's codec policy uses ``uint8``,
            ``uint4``, ``topk`` or ``qtopk``.  The residual is this peer's own (not shared, not
            checkpointed); a step alone or a failed round clears it.
        outer_lr, outer_momentum: DiLoCo's outer Nesterov SGD (0.7, 0.9 as in
            the DiLoCo paper).
        fragments: DiLoCo mode: split the parameter tensors into this many
            fragments of about equal size, and average one fragment per
            epoch, in turn (epoch ``e`` averages fragment ``e % fragments``;
            Streaming DiLoCo).  A round sends ``1 / fragments`` of the model,
            and each fragment's outer step comes every ``fragments`` epochs.
            Default 1 (every epoch averages every parameter).
        auxiliary: this peer trains nothing; it only helps reduce (call
            ``step()`` in a loop: each call waits for a round and joins it).
        matchmaking_time, target_group_size: passed to ``form_group`` (None:
            the node's :class:`~p2pdl.MatchmakingConfig`).
        allreduce: the all-reduce settings (None: the node's).
        bandwidth, reduce_rate: this peer's capacity (bytes/s) for the
            leader's load plan (None: what this peer's own rounds measured,
            ``node.allreduce.capacity()``; unknown before any).
        state_sync: download the state from peers when behind (True); with
            False a peer that falls behind only adopts the epoch.
        share_state_every: offer the state to joiners every this many
            epochs (1; serializing costs about one copy of the state).
        check_state_every: compare this peer's state with the others' at
            its epoch every this many epochs (5; at epochs where it offers
            its state), even when every round went well; 0 compares only
            after a failed or partial round, a split group or a lone
            donor's state.  A split that nothing else noticed is mended
            within this many epochs.  A check asks each peer seen at the
            epoch for its state's digest (a few bytes) and waits up to 2 s
            for those seen in the last round's epoch.
        sync_timeout: the longest one state download may take (s, 300).
        sync_retry: seconds between attempts while a download fails (5).
        ready_timeout: how long an auxiliary ``step()`` waits for a round (s, 60).
        discovery_time: a peer steps alone (no averaging) only when its view
            has had no other peer for this long (s, 10), counted from its
            start: peers started together find each other before their first
            step, and a view that loses the others for a moment does not
            make a peer step alone and drift apart.
        checkpoint_dir: write checkpoints here (None: none).  On start the
            newest intact one is loaded.
        checkpoint_every: every this many epochs (10).
        checkpoint_keep: how many to keep (3).
        resume_from: a directory of checkpoints (a monitor's backups,
            ``p2pdl monitor --backup-dir``, or another peer's
            ``checkpoint_dir``) to start from when ``checkpoint_dir`` holds
            none: the newest intact one is loaded (None: none).
        display_name: a name this peer's progress reports carry for people
            watching the run (1 to 64 printable characters; None: none).
            Nothing counts it: it is shown beside the peer's id.
    """

    batch_size_per_step: int | None = None
    mode: str = "dedloc"
    on_failure: str = "local"
    clip_grad_norm: float | None = None
    clip_sent_norm: float | None = None
    sent_momentum: float | str | None = "auto"
    delay_updates: bool = False
    error_feedback: bool | str = "auto"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 1
    auxiliary: bool = False
    matchmaking_time: float | None = None
    target_group_size: int | None = None
    allreduce: AllReduceConfig | None = None
    bandwidth: float | None = None
    reduce_rate: float | None = None
    state_sync: bool = True
    share_state_every: int = 1
    check_state_every: int = 5
    sync_timeout: float = 300.0
    sync_retry: float = 5.0
    ready_timeout: float = 60.0
    discovery_time: float = 10.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 10
    checkpoint_keep: int = 3
    resume_from: str | None = None
    display_name: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size_per_step is not None:
            check_int("batch_size_per_step", self.batch_size_per_step, 1, MAX_STEP_SAMPLES)
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.on_failure not in ON_FAILURE:
            raise ConfigError(f"on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}")
        for name in ("clip_grad_norm", "clip_sent_norm", "matchmaking_time", "bandwidth",
                     "reduce_rate"):
            value = getattr(self, name)
            if value is not None and not is_positive(value):
                raise ConfigError(f"{name} must be None or a positive number, got {value!r}")
        for name in ("outer_lr", "sync_timeout", "sync_retry", "ready_timeout"):
            if not is_positive(getattr(self, name)):
                raise ConfigError(f"{name} must be a positive number, "
                                  f"got {getattr(self, name)!r}")
        if not (is_number(self.discovery_time) and self.discovery_time >= 0):
            raise ConfigError(f"discovery_time must be a number >= 0, got {self.discovery_time!r}")
        if not (is_number(self.outer_momentum) and 0 <= self.outer_momentum < 1):
            raise ConfigError(f"outer_momentum must be in [0, 1), got {self.outer_momentum!r}")
        for name in ("delay_updates", "auxiliary", "state_sync"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False")
        if self.sent_momentum is not None and self.sent_momentum != "auto":
            if not (is_number(self.sent_momentum) and 0 <= self.sent_momentum < 1):
                raise ConfigError(f"sent_momentum must be 'auto', None or in [0, 1), "
                                  f"got {self.sent_momentum!r}")
            if self.mode == "diloco":
                raise ConfigError("sent_momentum applies to mode='dedloc' only (DiLoCo has "
                                  "its outer momentum)")
        if self.error_feedback != "auto" and not isinstance(self.error_feedback, bool):
            raise ConfigError(f"error_feedback must be True, False or 'auto', "
                              f"got {self.error_feedback!r}")
        check_int("fragments", self.fragments, 1, 2**16)
        if self.fragments > 1 and self.mode != "diloco":
            raise ConfigError("fragments applies to mode='diloco' only")
        if self.target_group_size is not None:
            check_int("target_group_size", self.target_group_size, 2, 2**16)
        if self.allreduce is not None and not isinstance(self.allreduce, AllReduceConfig):
            raise ConfigError("allreduce must be an AllReduceConfig or None")
        check_int("share_state_every", self.share_state_every, 1, 2**31)
        check_int("check_state_every", self.check_state_every, 0, 2**31)
        check_int("checkpoint_every", self.checkpoint_every, 1, 2**31)
        check_int("checkpoint_keep", self.checkpoint_keep, 1, 1000)
        for name in ("checkpoint_dir", "resume_from"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(getattr(self, name)))
        if self.display_name is not None:
            problem = check_info(self.display_name, None, None)
            if problem is not None:
                raise ConfigError(f"display_name: {problem}, got {self.display_name!r}")


def check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")

